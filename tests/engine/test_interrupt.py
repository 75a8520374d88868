"""Ctrl-C stops a run as SIGTERM does: at the next step boundary, with a checkpoint, marked
preempted, and the resume continues where it stopped. A second Ctrl-C stops at once, and
the message then says truthfully whether a resume continues or starts over."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from adalora_cli.engine.checkpoint import latest_checkpoint
from adalora_cli.rundir.run import RunDir, is_finished, read_metrics

from .conftest import ROOT, SMOKE, forked, same_outputs

pytestmark = pytest.mark.e2e  # training processes, Ctrl-C'd


def test_ctrl_c_checkpoints_and_the_resume_continues(smoke, tmp_path, baseline):
    out = tmp_path / "run"
    assert forked(smoke(out, "train.save_every=3"), "int@midstep=10") == 75
    status = RunDir.read_status(out)
    assert status["status"] == "preempted" and "SIGINT" in status["reason"]
    assert status["step"] == 10 and latest_checkpoint(out).name == "step-0000010"
    assert forked(["train", "--resume", str(out), "--quiet"]) == 0
    assert is_finished(out) and same_outputs(out, baseline) == []
    assert [r["step"] for r in read_metrics(out) if "loss" in r] == list(range(1, 33))


def _twice(tmp_path, *overrides: str) -> tuple[subprocess.CompletedProcess, object]:
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1", "ADALORA_FAULT": "int2@midstep=10"}
    done = subprocess.run([sys.executable, "-m", "adalora_cli", "train", SMOKE, *overrides,
                           "--run-dir", str(out), "--quiet"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    return done, out


def test_a_second_ctrl_c_without_a_checkpoint_says_the_resume_starts_over(tmp_path):
    done, out = _twice(tmp_path)  # save_every 0: nothing saved before step 10
    assert done.returncode == 130
    assert RunDir.read_status(out)["status"] == "failed" and latest_checkpoint(out) is None
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines[0].startswith("note: stopping at the next step boundary")
    assert lines[-1] == (f"error: interrupted; {out} is marked failed and has no checkpoint "
                         f"yet (a resume, adalora train --resume {out}, starts it over from "
                         "step 0)")


def test_a_second_ctrl_c_after_a_checkpoint_names_it(tmp_path):
    done, out = _twice(tmp_path, "train.save_every=3")
    assert done.returncode == 130
    assert latest_checkpoint(out).name == "step-0000009"
    assert done.stderr.splitlines()[-1] == (
        f"error: interrupted; {out} is marked failed; adalora train --resume {out} "
        "continues from its last checkpoint (step 9)")
