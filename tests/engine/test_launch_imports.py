"""``--nproc`` ranks run the ``adalora_cli`` of the CLI that launched them, never one that
happens to sit in the current directory (``python -m`` looks there first)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from adalora_cli.rundir.run import RunDir
from tests.conftest import decoy_package

from .conftest import ROOT, SMOKE

pytestmark = pytest.mark.e2e  # the installed CLI and its ranks, in fresh processes


def test_ranks_ignore_an_adalora_cli_in_the_current_directory(tmp_path):
    """The installed CLI (its own start never looks in the current directory), started
    where a decoy package would announce itself and stop any process that imports it."""
    marker = decoy_package(tmp_path)
    out = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("ADALORA_FAULT", None)
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        [str(Path(sys.executable).parent / "adalora"), "train", SMOKE,
         f"task.data_dir={ROOT / 'tests' / 'fixtures' / 'glue' / 'sst2'}",
         f"model.name_or_path={ROOT / 'tests' / 'fixtures' / 'tiny-bert'}",
         "method.name=lora", "train.max_steps=2", "--nproc", "2", "--run-dir", str(out),
         "--quiet"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert not marker.exists()
    assert RunDir.read_status(out)["status"] == "finished"
