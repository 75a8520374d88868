"""The tracker names come from one table (config.TRACKER_SINKS): a sink module without an
entry, an entry without its module, a sink calling itself by another name, or a tracker
without its pip extra fails here rather than at a user's `log.to`."""

from __future__ import annotations

import importlib
import re

import pytest

from adalora_cli.config import TRACKER_SINKS, ConfigError, from_dict
from adalora_cli.tracking.base import Sink
from tests.conftest import ROOT

TRACKING = ROOT / "adalora_cli" / "tracking"


def test_every_sink_module_has_an_entry_and_every_entry_its_module():
    modules = {p.stem for p in TRACKING.glob("*_sink.py")}
    assert modules == set(TRACKER_SINKS.values())
    assert sorted(modules) == ["mlflow_sink", "tensorboard_sink", "wandb_sink"]


@pytest.mark.parametrize("name", sorted(TRACKER_SINKS))
def test_each_sink_answers_to_its_name(name):
    module = importlib.import_module(f"adalora_cli.tracking.{TRACKER_SINKS[name]}")
    sinks = [v for v in vars(module).values()
             if isinstance(v, type) and issubclass(v, Sink) and v is not Sink]
    assert [s.name for s in sinks] == [name]
    assert callable(module.open_sink) and module.PACKAGES


def test_each_tracker_has_its_extra_and_the_tracking_extra_holds_them_all():
    text = (ROOT / "pyproject.toml").read_text()
    block = re.search(r"^\[project\.optional-dependencies\](.*?)^\[", text, re.S | re.M)[1]
    extras = dict(re.findall(r"^([a-z_-]+) = (\[.*\])$", block, re.M))
    for name in TRACKER_SINKS:
        assert name in extras, f"pyproject.toml has no [{name}] extra"
    assert extras["tracking"] == f'["adalora[{",".join(TRACKER_SINKS)}]"]'


def test_log_to_accepts_the_table_and_refuses_the_rest():
    assert from_dict({"log": {"to": list(TRACKER_SINKS)}}).log.to == list(TRACKER_SINKS)
    with pytest.raises(ConfigError, match=r"log\.to\[0\] must be one of "
                                          r"tensorboard, wandb, mlflow; got 'comet'"):
        from_dict({"log": {"to": ["comet"]}})
