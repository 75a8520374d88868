"""train.* values that can only be wrong are refused when the config loads, before a run
directory exists (not at the first evaluation, nor silently accepted)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from adalora_cli.cli import app
from adalora_cli.config import ConfigError, load_config

from .conftest import ROOT

SMOKE = str(ROOT / "configs" / "smoke" / "glue.yaml")

BAD = [
    ("train.eval_batch_size=0", "train.eval_batch_size must be >= 1, got 0"),
    ("train.weight_decay=-1", "train.weight_decay must be >= 0, got -1.0"),
    ("train.warmup_steps=-1", "train.warmup_steps must be >= 0, got -1"),
    ("train.max_grad_norm=-1",
     "train.max_grad_norm must be >= 0 (0 disables clipping), got -1.0"),
]


@pytest.mark.parametrize("override,message", BAD)
def test_bad_train_values_are_refused_by_name(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(SMOKE, [override])
    assert str(err.value) == message


@pytest.mark.parametrize("override,message", BAD)
def test_the_cli_refuses_them_before_writing_anything(override, message, tmp_path, in_repo):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", SMOKE, override, "--run-dir", str(out), "-q"])
    assert result.exit_code == 2
    assert result.output.strip() == f"error: {message}"
    assert not out.exists()


@pytest.mark.parametrize("override", ["train.weight_decay=0", "train.warmup_steps=0",
                                      "train.max_grad_norm=0", "train.eval_batch_size=1"])
def test_the_edge_values_are_accepted(override):
    load_config(SMOKE, [override])
