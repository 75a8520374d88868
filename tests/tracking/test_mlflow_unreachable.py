"""An MLflow server that accepts no connection, or accepts one and never answers, costs a run
seconds and one warning, not the minutes MLflow's own retries take."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from adalora_cli.config import load_config
from adalora_cli.tracking import Trackers, mlflow_sink
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


class Listener:
    """A local server that accepts every connection and then does ``reply`` with it:
    nothing (a hung server), close it, or answer."""

    def __init__(self, reply: bytes | None = None, close: bool = False):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.reply, self.close, self.seen, self.held = reply, close, [], []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.settimeout(2)
            try:
                self.seen.append(conn.recv(1024))
            except OSError:
                pass
            if self.reply is not None:
                conn.sendall(self.reply)
            if self.close or self.reply is not None:
                conn.close()
            else:
                self.held.append(conn)  # open, never answered

    def stop(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


def _bounded(fn, limit: float = 60.0):
    """Run ``fn`` in a thread; a hang guard (not a speed assertion): before the fix this
    waited out MLflow's retries, 372 s."""
    box: dict = {}
    thread = threading.Thread(target=lambda: box.update(out=_catch(fn)), daemon=True)
    thread.start()
    thread.join(limit)
    assert not thread.is_alive(), "the reachability check did not return"
    return box["out"]


def _catch(fn):
    try:
        return fn()
    except Exception as err:  # noqa: BLE001 - handed back to the test
        return err


def test_a_server_that_accepts_and_never_answers_is_unreachable(monkeypatch):
    server = Listener()
    uri = f"http://127.0.0.1:{server.port}/prefix/"
    try:
        err = _bounded(lambda: check_reachable(uri, timeout=0.5))
    finally:
        server.stop()
    assert isinstance(err, ConnectionError)
    assert str(err) == (f"MLflow server {uri} is unreachable (no answer within 0.5 s); check "
                        "log.mlflow_uri and that the server runs")
    assert server.seen[0].startswith(b"GET /prefix/health HTTP/1.0\r\n")


def test_a_server_that_hangs_up_is_unreachable_and_one_that_answers_is_not():
    closing = Listener(close=True)
    try:
        err = _bounded(lambda: check_reachable(f"http://127.0.0.1:{closing.port}", 2.0))
    finally:
        closing.stop()
    assert isinstance(err, ConnectionError) and "unreachable (" in str(err)
    answering = Listener(reply=b"HTTP/1.0 404 Not Found\r\n\r\n")
    try:
        assert _bounded(lambda: check_reachable(f"http://127.0.0.1:{answering.port}")) is None
    finally:
        answering.stop()


def test_a_hung_server_costs_the_run_one_warning(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setattr(mlflow_sink, "CONNECT_S", 0.5)
    server = Listener()
    uri = f"http://127.0.0.1:{server.port}"
    cfg = load_config(SMOKE, ["log.to=[mlflow]", f"log.mlflow_uri={uri}"])
    warnings: list[str] = []

    def start() -> None:
        Trackers.open(cfg, tmp_path, resumed=False, warn=warnings.append).close()

    try:
        assert _bounded(start) is None
    finally:
        server.stop()
    assert len(warnings) == 1
    assert f"MLflow server {uri} is unreachable (no answer within 0.5 s)" in warnings[0]
