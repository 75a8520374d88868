"""An MLflow server that accepts no connection costs a run seconds and one warning, not
the minutes MLflow's own retries take."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from adalora_cli.config import load_config
from adalora_cli.tracking import Trackers
from adalora_cli.tracking.mlflow_sink import check_reachable

SMOKE = str(Path(__file__).resolve().parents[2] / "configs" / "smoke" / "glue.yaml")


def closed_port() -> int:
    """A local port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_server_is_named():
    uri = f"http://127.0.0.1:{closed_port()}"
    with pytest.raises(ConnectionError) as err:
        check_reachable(uri)
    assert str(err.value).startswith(f"MLflow server {uri} is unreachable (")
    assert "check log.mlflow_uri" in str(err.value)


def test_local_stores_are_not_probed(tmp_path):
    check_reachable(f"sqlite:///{tmp_path}/mlflow.db")
    check_reachable(None)


def test_the_run_goes_on_with_one_warning(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = f"http://127.0.0.1:{closed_port()}"
    cfg = load_config(SMOKE, ["log.to=[mlflow]", f"log.mlflow_uri={uri}"])
    warnings: list[str] = []
    trackers = Trackers.open(cfg, tmp_path, resumed=False, warn=warnings.append)
    trackers.close()
    assert len(warnings) == 1 and f"MLflow server {uri} is unreachable" in warnings[0]
