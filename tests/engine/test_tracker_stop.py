"""A stop signal wins over a tracker that hangs: SIGTERM while the run waits for an MLflow
server that answers ``/health`` and never its API ends the run as any stop does, with a
checkpoint, marked preempted, the tracker dropped with one warning. Before, the run sat in
MLflow's retries for over 15 minutes, through SIGTERM, until SLURM's SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from adalora_cli.engine.checkpoint import latest_checkpoint
from adalora_cli.rundir.run import RunDir
from tests.tracking.hung_server import HungServer

from .conftest import ROOT, SMOKE

pytestmark = pytest.mark.e2e  # a training process, SIGTERM'd


def until(check, limit: float) -> None:
    """Poll ``check()`` until true; a hang guard, not a speed assertion."""
    deadline = time.monotonic() + limit
    while not check():
        assert time.monotonic() < deadline, "gave up waiting"
        time.sleep(0.1)


def test_sigterm_while_a_tracker_hangs_checkpoints_and_stops(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    with HungServer(life=300) as server:
        # a bound far longer than the test: only the stop can end the wait
        proc = subprocess.Popen(
            [sys.executable, "-m", "adalora_cli", "train", SMOKE, "log.to=[mlflow]",
             f"log.mlflow_uri={server.uri}", "log.tracker_timeout_s=600", "--run-dir",
             str(out), "--quiet"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        try:
            until(server.api_calls, 240)  # the run now waits in MLflow's API
            proc.send_signal(signal.SIGTERM)
            # a hang guard, not a speed assertion: the stop costs the 5 s grace, a step
            # and a checkpoint
            _, stderr = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 75, stderr
    status = RunDir.read_status(out)
    assert status["status"] == "preempted" and "SIGTERM" in status["reason"]
    assert status["step"] == 1 and latest_checkpoint(out).name == "step-0000001"
    warnings = [line for line in stderr.splitlines() if line.startswith("warning:")]
    assert warnings == ["warning: mlflow could not be opened (no answer within 5 s of the "
                        "stop signal); logging to the run directory only for it"]
