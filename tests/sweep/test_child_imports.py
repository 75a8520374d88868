"""A sweep's runs (local pool or SLURM task, one process or torchrun) run the
``adalora_cli`` of the sweep that started them, never one in the current directory
(``python -m`` looks there first)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import adalora_cli
from adalora_cli.engine.launch import RANK_MAIN
from adalora_cli.rundir.run import RunDir
from adalora_cli.sweep.plan import PlannedRun
from adalora_cli.sweep.slurm_job import train_command
from tests.conftest import ROOT, decoy_package


@pytest.mark.parametrize("nproc", [1, 2])
def test_a_slurm_tasks_command_names_this_adalora_cli(tmp_path, nproc):
    run = PlannedRun(name="r", config=Path("c.yaml"), method="lora", budget_level=None,
                     seed=0, overrides=("a=1",), size="r=2")
    cmd = train_command(run, tmp_path / "r", resume=False, nproc=nproc)
    program = cmd[cmd.index("-c") - 1:]
    assert program[:4] == [sys.executable, "-c", RANK_MAIN,
                           os.path.abspath(adalora_cli.__file__)]
    assert program[4:] == ["train", "c.yaml", "a=1", "--run-dir", str(tmp_path / "r")]
    assert "adalora_cli" not in cmd[:cmd.index("-c")]  # never `-m adalora_cli`
    if nproc > 1:
        assert cmd[1:3] == ["-m", "torch.distributed.run"] and "--no-python" in cmd


@pytest.mark.e2e
def test_a_local_sweep_ignores_an_adalora_cli_in_the_current_directory(tmp_path):
    marker = decoy_package(tmp_path)
    manifest = tmp_path / "m.yaml"
    manifest.write_text(
        "name: decoy\nseeds: [0]\nruns:\n"
        f"  - configs: [{ROOT / 'configs' / 'smoke' / 'glue.yaml'}]\n    methods: [lora]\n"
        "    overrides:\n"
        f"      - task.data_dir={ROOT / 'tests' / 'fixtures' / 'glue' / 'sst2'}\n"
        f"      - model.name_or_path={ROOT / 'tests' / 'fixtures' / 'tiny-bert'}\n"
        "      - train.max_steps=2\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run([str(Path(sys.executable).parent / "adalora"), "sweep", str(manifest),
                           "--sweep-dir", str(tmp_path / "runs")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not marker.exists()
    runs = [p for p in (tmp_path / "runs").rglob("status.json")]
    assert len(runs) == 1 and RunDir.read_status(runs[0].parent)["status"] == "finished"
