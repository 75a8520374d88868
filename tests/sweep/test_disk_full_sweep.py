"""A sweep that cannot write its own files (a full disk) stops in one line and stops the
runs it started (each checkpoints and ends preempted), instead of leaving them unwatched."""

from __future__ import annotations

import errno
import os
import signal
from pathlib import Path

import pytest

from adalora_cli.rundir.run import RunDir
from adalora_cli.sweep import local
from adalora_cli.sweep.plan import PlannedRun, SweepSpec

SMOKE = "configs/smoke/glue.yaml"


def test_a_full_disk_stops_the_sweep_and_its_runs(tmp_path, in_repo, monkeypatch):
    run = PlannedRun("long", Path(SMOKE), "adalora", None, 0, ("train.epochs=2000",), "")
    metrics = tmp_path / "long" / "metrics.jsonl"
    real_sleep = local.time.sleep

    def sleep(seconds):
        if metrics.is_file() and metrics.stat().st_size > 0:  # the run is training
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "x"))
        real_sleep(seconds)

    monkeypatch.setattr(local.time, "sleep", sleep)
    try:
        with pytest.raises(OSError) as err:
            local.execute(SweepSpec("t", [], Path("x")), [run], tmp_path, quiet=True)
        assert err.value.strerror == ("the sweep stopped: No space left on device; its "
                                      "running runs were stopped, rerun the sweep to resume "
                                      "them")
        status = RunDir.read_status(tmp_path / "long")
        assert status["status"] == "preempted"  # stopped by the sweep, with a checkpoint
        assert not (tmp_path / "long" / "launch.json").exists()
    finally:
        pid = (RunDir.read_status(tmp_path / "long") or {}).get("pid")
        if pid and (RunDir.read_status(tmp_path / "long") or {}).get("status") == "running":
            os.kill(pid, signal.SIGKILL)
