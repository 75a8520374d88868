"""A sweep's run sharded over the GPUs of its SLURM job: ``gpus_per_job=2`` makes each run a
two-process torchrun, and ``train.sharding: fsdp`` in the manifest shards it. Through
submitit's local executor (no SLURM needed; on a CPU the two processes use gloo)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from adalora_cli.rundir.run import is_finished
from adalora_cli.sweep.plan import build_spec, plan
from adalora_cli.sweep.slurm import SlurmLauncher
from adalora_cli.sweep.slurm_job import train_command
from adalora_cli.sweep.slurm_options import parse_slurm

ROOT = Path(__file__).resolve().parents[2]
SMOKE = "configs/smoke/glue.yaml"
SHORT = ["train.max_steps=12", "adalora.t_init=2", "adalora.delta_t=2", "adalora.t_final=3"]


@pytest.mark.slow  # a two-process FSDP run under submitit: a minute or more on a shared CPU
def test_a_slurm_sweep_runs_each_run_sharded_over_its_gpus(tmp_path):
    manifest = tmp_path / "sharded.yaml"
    manifest.write_text(yaml.safe_dump({"name": "sharded", "runs": [
        {"configs": [str(ROOT / SMOKE)], "methods": ["adalora"],
         "overrides": [*SHORT, "train.sharding=fsdp"]}]}))
    os.chdir(ROOT)
    spec = build_spec(manifest)
    runs = plan(spec)
    command = train_command(runs[0], tmp_path / "run", resume=False, nproc=2)
    assert command[1:6] == ["-m", "torch.distributed.run", "--standalone",
                            "--nproc_per_node=2", "-m"]
    assert "train.sharding=fsdp" in command
    where = tmp_path / "sweep"
    options = parse_slurm(["time=10,gpus_per_job=2"])
    outcomes = SlurmLauncher(options, cluster="local", wait=True, poll_seconds=0.5).launch(
        spec, runs, where)
    assert [o.status for o in outcomes] == ["finished"], (where / "logs").iterdir()
    run = where / runs[0].name
    assert is_finished(run)
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["train"]["sharding"] == "fsdp"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["total_steps"] == 12 and summary["final_budget"] == 16
    log = (where / "logs" / f"{runs[0].name}.log").read_text()
    assert "--nproc_per_node=2" in log.splitlines()[0]  # one torchrun, two ranks
