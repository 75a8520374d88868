"""Several processes: a stopped ``--nproc 2`` run resumes exactly, dropout included, and
its ranks never outlive the launcher.

Each rank draws its own dropout masks, so a checkpoint keeps every rank's RNG state; with
only rank 0's, the resumed rank 1 would drop other units and the run would diverge at the
first step after the checkpoint.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from adalora_cli.rundir.run import RunDir

from .conftest import COMPARED, ROOT, SMOKE

pytestmark = pytest.mark.e2e


def adalora(*argv: str, fault: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("ADALORA_FAULT", None)
    if fault:
        env["ADALORA_FAULT"] = fault
    return subprocess.run([sys.executable, "-m", "adalora_cli", *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def two(out: Path, *extra: str) -> list[str]:
    return ["train", SMOKE, "train.save_every=5", *extra, "--run-dir", str(out), "--quiet",
            "--nproc", "2"]


def test_a_stopped_two_process_run_resumes_exactly_with_dropout(tmp_path):
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    assert adalora(*two(straight)).returncode == 0
    # SIGTERM to both ranks in the middle of step 20 (save_every=5 last saved step 15).
    # Rank 0's evaluation at step 16 drew from its RNG alone: from there on the ranks'
    # states differ, and rank 1 must get its own back.
    first = adalora(*two(stopped), fault="term@midstep=20")
    assert first.returncode == 75, first.stderr
    assert RunDir.read_status(stopped)["step"] == 20
    assert first.stderr.count("error:") == 1  # rank 0 speaks for the run
    resumed = adalora("train", "--resume", str(stopped), "--quiet", "--nproc", "2")
    assert resumed.returncode == 0, resumed.stderr
    differ = [n for n in COMPARED
              if (straight / n).read_bytes() != (stopped / n).read_bytes()]
    assert differ == []


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie has ended; only its parent has not reaped it


def _wait_until(cond, limit: float = 300.0) -> bool:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.2)
    return cond()


def _launch_long_run(out: Path, **streams) -> subprocess.Popen:
    """A 2-process run long enough to be stopped mid-training, in its own session."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("ADALORA_FAULT", None)
    return subprocess.Popen(
        [sys.executable, "-m", "adalora_cli", *two(out, "train.epochs=2000")], cwd=ROOT,
        env=env, start_new_session=True, **streams)


def test_ranks_stop_when_their_launcher_is_killed(tmp_path):
    out = tmp_path / "run"
    launcher = _launch_long_run(out, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ranks: list[int] = []
    try:
        assert _wait_until(lambda: (out / "metrics.jsonl").is_file()
                           and (out / "metrics.jsonl").stat().st_size > 0)
        ranks = _children(launcher.pid)
        assert len(ranks) == 2
        launcher.kill()  # SIGKILL: the launcher can pass nothing on
        launcher.wait()
        assert _wait_until(lambda: not any(_alive(p) for p in ranks), limit=120)
        status = RunDir.read_status(out)
        assert status["status"] == "preempted"  # rank 0 checkpointed on its way out
        assert (out / "checkpoints").is_dir()
    finally:
        for pid in [launcher.pid, *ranks]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_sigterm_to_the_launcher_preempts_with_one_error_line(tmp_path):
    out = tmp_path / "run"
    launcher = _launch_long_run(out, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    try:
        assert _wait_until(lambda: (out / "metrics.jsonl").is_file()
                           and (out / "metrics.jsonl").stat().st_size > 0)
        launcher.send_signal(signal.SIGTERM)  # as a scheduler stops a job
        _, stderr = launcher.communicate(timeout=300)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 75
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "stopped by SIGTERM" in errors[0], stderr
    assert RunDir.read_status(out)["status"] == "preempted"
