"""Sweeps that never lose work: shared by two sweep processes, and stopped without orphans."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from adalora_cli.rundir.run import RunDir, is_finished

ROOT = Path(__file__).resolve().parents[2]
SMOKE = "configs/smoke/glue.yaml"


def sweep_process(*args: str) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "adalora_cli", "sweep", SMOKE, *args],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def gone(pid: int, within: float) -> bool:
    """The process has exited (a zombie awaiting its reaper counts as exited)."""
    deadline = time.time() + within
    while time.time() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.2)
    return False


@pytest.mark.e2e
def test_two_identical_sweeps_share_the_runs(tmp_path):
    where = tmp_path / "sweep"
    args = ("--methods", "lora,bitfit", "--seeds", "0,1", "train.epochs=1",
            "--sweep-dir", str(where), "--quiet")
    first, second = sweep_process(*args), sweep_process(*args)
    outputs = [p.communicate(timeout=600) for p in (first, second)]
    assert first.returncode == 0 and second.returncode == 0, outputs
    runs = sorted(p for p in where.iterdir() if (p / "config.yaml").exists())
    assert [p.name for p in runs] == ["glue-bitfit-s0", "glue-bitfit-s1", "glue-lora-s0",
                                      "glue-lora-s1"]
    assert all(is_finished(p) for p in runs)
    # each run trained exactly once, by one sweep or the other, never from scratch twice
    events = [json.loads(line) for line in (where / "sweep_log.jsonl").read_text().splitlines()]
    finished = Counter(e["run"] for e in events if e["event"] == "finished")
    assert finished == {p.name: 1 for p in runs}
    assert all(json.loads((p / "summary.json").read_text())["attempts"] == 1 for p in runs)
    # between them the two sweeps account for every run: trained here, or by the other one
    for out, _ in outputs:
        assert "4 runs:" in out


@pytest.mark.e2e
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_a_stopped_sweep_leaves_no_orphans(tmp_path, how):
    where = tmp_path / "sweep"
    run = where / "glue-lora-s0"
    proc = sweep_process("--methods", "lora", "--seeds", "0", "train.epochs=400",
                         "--sweep-dir", str(where), "--quiet")
    deadline = time.time() + 180
    while not (run / "metrics.jsonl").exists() and time.time() < deadline:
        time.sleep(0.2)  # the run is training
    child = RunDir.read_status(run)["pid"]
    proc.send_signal(how)
    _, stderr = proc.communicate(timeout=120)
    if how == signal.SIGTERM:
        assert proc.returncode == 143 and "checkpointed" in stderr
    deadline = time.time() + 120
    while (RunDir.read_status(run) or {}).get("status") == "running" and time.time() < deadline:
        time.sleep(0.2)  # under SIGKILL the child learns of it from the kernel (PDEATHSIG)
    status = RunDir.read_status(run)
    assert status["status"] == "preempted", status
    assert gone(child, within=30)  # the training process ended, it is no orphan
    assert (run / "checkpoints" / f"step-{status['step']:07d}").is_dir()
    plan = subprocess.run([sys.executable, "-m", "adalora_cli", "sweep", SMOKE,
                           "--methods", "lora", "--seeds", "0", "train.epochs=400",
                           "--sweep-dir", str(where), "--dry-run"], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"},
                          timeout=300)
    assert "resume (unfinished)" in plan.stdout, plan.stdout + plan.stderr


def test_a_sweep_releases_only_its_own_launch_claim(tmp_path):
    from adalora_cli.sweep.runs import claim_launch, release_launch, run_state

    run = tmp_path / "r"
    assert claim_launch(run) == "empty"  # a new directory: ours to start
    assert run_state(run) == "running" and claim_launch(run) is None  # we are starting it
    release_launch(run)
    assert not (run / "launch.json").exists()
    other = {"host": "node-3", "pid": 77, "pid_start": 1, "boot_id": "x"}
    (run / "launch.json").write_text(json.dumps(other))
    release_launch(run)  # another sweep's claim stays
    assert json.loads((run / "launch.json").read_text()) == other
