"""TensorBoard after a resume whose first logged step the checkpoint already covers (an
evaluation a stop cut short, or the final evaluation): every training point survives the
purge, once, with the values of the run directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from adalora_cli.engine.checkpoint import latest_checkpoint, load_checkpoint
from adalora_cli.rundir.run import is_finished, read_metrics
from tests.engine.conftest import SMOKE, forked


def scalars(run: Path, tag: str) -> list[tuple[int, float]]:
    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


@pytest.mark.parametrize("fault, save_every, code, step, pending", [
    ("term@eval=16", 0, 75, 16, True),  # the evaluation at step 16 (eval_every) cut short
    ("term@eval=32", 0, 75, 32, False),  # the final evaluation, after the checkpoint at T
    ("kill@step=11", 3, -9, 9, False),  # an ordinary resume: its first point is new
])
def test_every_training_point_survives_the_resume(fault, save_every, code, step, pending,
                                                   tmp_path, in_repo):
    out = tmp_path / "run"
    args = ["train", SMOKE, "log.to=[tensorboard]", f"train.save_every={save_every}",
            "--run-dir", str(out), "--quiet"]
    assert forked(args, fault) == code
    latest = latest_checkpoint(out)
    assert latest.name == f"step-{step:07d}"
    assert load_checkpoint(latest)[1]["eval_pending"] is pending
    assert forked(["train", "--resume", str(out), "--quiet"]) == 0
    assert is_finished(out)

    rows = read_metrics(out)
    train = [(r["step"], r["loss"]) for r in rows if "loss" in r]
    assert [s for s, _ in train] == list(range(1, 33))  # the run directory: all 32
    tb = scalars(out, "train/loss")
    assert [s for s, _ in tb] == list(range(1, 33))  # TensorBoard: all 32, each once
    assert [v for _, v in tb] == pytest.approx([v for _, v in train], rel=1e-6)  # float32
    budget = scalars(out, "train/budget")
    assert [s for s, _ in budget] == list(range(1, 33))
    evals = [(r["step"], r["accuracy"]) for r in rows if r.get("split") == "validation"]
    assert [s for s, _ in scalars(out, "eval/validation/accuracy")] == [s for s, _ in evals]
    history = [json.loads(line)["step"]
               for line in (out / "rank_history.jsonl").read_text().splitlines()]
    assert [s for s, _ in scalars(out, "rank/total")] == history
