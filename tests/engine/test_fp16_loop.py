"""The smoke run under fp16 loss scaling, in process on the CPU: the precision choice is
answered as on a V100 (fp16 autocast, which the CPU runs as fp32) and a CPU GradScaler
scales the loss; gradients are made infinite at chosen steps, as an fp16 overflow makes
them. Skipped steps are logged and counted, the run finishes; a long enough run of them
fails the run with one line."""

from __future__ import annotations

import contextlib
import json
import math

import pytest
from typer.testing import CliRunner

from adalora_cli.cli import app
from adalora_cli.engine import precision, step
from adalora_cli.engine.step import Stepper
from adalora_cli.rundir.run import RunDir, read_metrics

from .conftest import SMOKE


@pytest.fixture()
def fp16(monkeypatch, in_repo):
    """fp16 with loss scaling on the CPU; returns the set of steps whose gradients are
    made infinite after the backward pass."""
    # the build's decision, made as on a V100; the CPU runs its forward in fp32
    monkeypatch.setattr(precision, "resolve", lambda p, d: "fp16")
    monkeypatch.setattr(precision.Precision, "context", lambda self: contextlib.nullcontext)
    poisoned: set[int] = set()
    update = Stepper.update

    def overflowing(self, t, loss=None):
        if t in poisoned:
            self.handle.trainable[0].grad.view(-1)[0] = math.inf
        return update(self, t, loss)

    monkeypatch.setattr(Stepper, "update", overflowing)
    return poisoned


def train(out, *overrides):
    return CliRunner().invoke(app, ["train", SMOKE, "train.log_every=1", *overrides,
                                    "--run-dir", str(out), "--quiet"])


def test_skipped_steps_are_logged_counted_and_the_run_finishes(fp16, tmp_path):
    fp16.update({3, 9, 10})  # 10: a mask event (t > t_init = 4, 10 % delta_t == 0)
    result = train(tmp_path / "run")
    assert result.exit_code == 0, result.output
    rows = [r for r in read_metrics(tmp_path / "run") if "loss" in r]
    assert [r["step"] for r in rows] == list(range(1, 33))  # t counts skipped steps
    assert [r["step"] for r in rows if r.get("skipped")] == [3, 9, 10]
    assert all(math.isfinite(r["loss"]) for r in rows)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["precision"] == {"autocast": "fp16", "base_dtype": "fp32",
                                    "loss_scaling": True, "skipped_steps": 3}
    # the mask events kept their schedule: every delta_t = 2 steps from 6 to T - t_f = 24,
    # then the final pattern at 25
    history = [json.loads(line)["step"] for line in
               (tmp_path / "run" / "rank_history.jsonl").read_text().splitlines()]
    assert history == [*range(6, 25, 2), 25]


def test_a_run_of_skipped_steps_fails_the_run_in_one_line(fp16, tmp_path, monkeypatch):
    monkeypatch.setattr(step, "MAX_SKIPPED", 4)
    fp16.update(range(5, 40))
    result = train(tmp_path / "run")
    assert result.exit_code != 0
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(
        "error: FloatingPointError: the fp16 loss scaler skipped 4 steps in a row (steps 5-8, "
        "last loss ")
    assert "likely causes: fp16 autocast overflowed (set train.precision=bf16 or fp32)" \
        in lines[0]
    status = RunDir.read_status(tmp_path / "run")
    assert status["status"] == "failed" and "skipped 4 steps in a row" in status["error"]
    assert not (tmp_path / "run" / "summary.json").exists()
    skipped = [r["step"] for r in read_metrics(tmp_path / "run") if r.get("skipped")]
    assert skipped == [5, 6, 7]  # the fourth fails before its row is written


def test_cpu_runs_say_fp32(smoke_runs):
    summary = json.loads((smoke_runs(SMOKE) / "summary.json").read_text())
    assert summary["precision"] == {"autocast": "fp32", "base_dtype": "fp32",
                                    "loss_scaling": False, "skipped_steps": 0}
