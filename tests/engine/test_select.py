"""``train.select=best``: the run ends with the weights, rank pattern and scores of its best
evaluation; early stopping ends training after ``patience`` evaluations without improvement;
both survive a kill and a resume; a metric the task does not report is refused.

The runs are the causal-LM smoke run at a learning rate high enough (0.3) that its
validation loss peaks before the end (every 2 steps: best at step 18 of 24). Which step
should win is computed here from the evaluation rows of the same run trained with
``train.select=last``, whose training is the same row for row.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from adalora_cli.artifacts.export import export_run
from adalora_cli.artifacts.load import load_run
from adalora_cli.artifacts.rescore import rescore
from adalora_cli.cli import app
from adalora_cli.rundir.run import RunDir, read_metrics
from tests.conftest import ROOT, copy_of

from .conftest import forked, forked_ranks

SMOKE = "configs/smoke/causal_lm.yaml"
PEAKS = ("train.eval_every=2", "task.max_new_tokens=0", "train.learning_rate=0.3")
"""Validation loss every 2 steps, no generation: the loss falls, jumps at step 10, falls to
its lowest at step 18 and rises again."""


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def eval_rows(run: Path) -> list[dict]:
    return [r for r in read_metrics(run) if r.get("split") == "validation" and r["step"] > 0]


def best_of(rows: list[dict], patience: int = 0) -> tuple[int, int | None]:
    """(best step, step where early stopping ends training or None), the loss lower being
    better and the first step to reach a value keeping it: a second implementation."""
    best, value, since = None, float("inf"), 0
    for row in rows:
        if row["loss"] < value:
            best, value, since = row["step"], row["loss"], 0
        else:
            since += 1
            if patience and since == patience:
                return best, row["step"]
    return best, None


@pytest.fixture(scope="module")
def last_run(smoke_runs):
    return smoke_runs(SMOKE, *PEAKS)


@pytest.fixture(scope="module")
def best_run(smoke_runs):
    return smoke_runs(SMOKE, *PEAKS, "train.select=best")


def test_best_takes_the_step_that_scored_best(best_run, last_run):
    rows = eval_rows(last_run)
    chosen, _ = best_of(rows)
    assert chosen == 18 and rows[-1]["step"] == 24  # a peak before the end, as planned
    row = next(r for r in rows if r["step"] == chosen)
    assert summary(best_run)["selected"] == {
        "step": 18, "split": "validation", "metric": "loss", "value": row["loss"],
        "lower_is_better": True, "from": "best", "stopped_early_at": None}
    # the run's scores are the chosen step's, the training itself unchanged
    assert summary(best_run)["metrics"] == {"validation": {"loss": row["loss"],
                                                           "perplexity": row["perplexity"]}}
    assert read_metrics(best_run) == read_metrics(last_run)
    assert summary(last_run)["metrics"]["validation"]["loss"] == rows[-1]["loss"]
    assert "selected" not in summary(last_run)
    assert ((best_run / "adapter_model.safetensors").read_bytes()
            != (last_run / "adapter_model.safetensors").read_bytes())
    assert not (best_run / "best").exists() and not (best_run / "checkpoints").exists()


def test_the_rank_pattern_is_the_mask_at_the_chosen_step(smoke_runs):
    """Chosen at step 9 (evaluations every 3 steps, stopped at 12), in the pruning phase:
    its ranks are those of the last mask event before it, step 8, not b(T)'s."""
    run = smoke_runs(SMOKE, *PEAKS[1:], "train.eval_every=3", "train.select=best",
                     "train.early_stop_patience=1")
    assert summary(run)["selected"]["step"] == 9
    events = [json.loads(line) for line in
              (run / "rank_history.jsonl").read_text().splitlines() if line]
    at = max((e for e in events if e["step"] <= 9), key=lambda e: e["step"])
    assert at["step"] == 8
    pattern = json.loads((run / "rank_pattern.json").read_text())
    assert pattern == at["ranks"]
    assert summary(run)["final_budget"] == sum(at["ranks"].values()) > 28  # b(T) is 28


def test_eval_and_exports_take_the_chosen_weights(smoke_runs, tmp_path):
    """``adalora eval`` scores the run's weights to the recorded value, and the PEFT export
    computes what they compute, though at step 9 masked singular values have grown back
    since the mask event at step 8 (docs/maths.md#masking)."""
    shared = smoke_runs(SMOKE, *PEAKS[1:], "train.eval_every=3", "train.select=best",
                        "train.early_stop_patience=1")
    run = copy_of(shared, tmp_path / "run")  # eval writes into the run
    chosen = summary(run)["selected"]
    scores = json.loads(rescore(run, quiet=True).read_text())["metrics"]["validation"]
    assert scores["loss"] == pytest.approx(chosen["value"], rel=1e-12)
    from peft import AutoPeftModelForCausalLM

    export_run(run, "peft", tmp_path / "peft")
    ids = torch.tensor([[1, 40, 17, 99, 3, 250, 5]])
    with torch.no_grad():
        ours = load_run(run)[0].eval()(ids).logits
        theirs = AutoPeftModelForCausalLM.from_pretrained(tmp_path / "peft").eval()(ids).logits
    assert torch.allclose(theirs, ours, atol=1e-5)
    card = (tmp_path / "peft/README.md").read_text()
    assert "These are the scores of step 9, chosen by validation/loss" in card
    assert "Early stopping ended training at step 12." in card


@pytest.mark.parametrize("patience", [1, 2])
def test_early_stopping_ends_training_after_patience_evaluations(smoke_runs, last_run,
                                                                 patience):
    run = smoke_runs(SMOKE, *PEAKS, "train.select=best",
                     f"train.early_stop_patience={patience}")
    chosen, stop = best_of(eval_rows(last_run), patience)
    assert (chosen, stop) == {1: (8, 10), 2: (8, 12)}[patience]
    steps = [r["step"] for r in read_metrics(run) if "loss" in r and "split" not in r]
    assert steps == list(range(1, stop + 1))  # no step after the stop
    assert [r["step"] for r in eval_rows(run)] == list(range(2, stop + 1, 2))
    row = next(r for r in eval_rows(last_run) if r["step"] == chosen)
    selected = summary(run)["selected"]
    assert (selected["step"], selected["stopped_early_at"], selected["value"]) == (
        chosen, stop, row["loss"])
    assert summary(run)["metrics"]["validation"]["loss"] == row["loss"]
    assert RunDir.read_status(run)["status"] == "finished"


@pytest.mark.e2e
def test_a_run_killed_and_resumed_chooses_the_same_step(in_repo, best_run, tmp_path):
    """Killed right after the best (18) was written but before a checkpoint knew it (the
    checkpoint at 16 resumes to best 14), then after the checkpoint at 20 that knows it."""
    out = tmp_path / "run"
    args = ["train", SMOKE, *PEAKS, "train.select=best", "train.save_every=4",
            "--run-dir", str(out), "--quiet"]
    assert forked(args, "kill@step=19") == -9
    assert sorted(p.name for p in (out / "best").iterdir()) == [
        "records.json", "step-0000014", "step-0000018"]
    resume = ["train", "--resume", str(out), "--quiet"]
    assert forked(resume, "kill@step=23") == -9
    assert forked(resume) == 0
    assert summary(out)["selected"] == summary(best_run)["selected"]
    for name in ("metrics.jsonl", "rank_pattern.json", "adapter_model.safetensors"):
        assert (out / name).read_bytes() == (best_run / name).read_bytes(), name
    assert summary(out)["metrics"] == summary(best_run)["metrics"]
    assert not (out / "best").exists()


@pytest.mark.e2e
def test_a_resume_never_writes_through_a_linked_best_folder(in_repo, tmp_path):
    """A resume deletes the bests the killed attempt found after its checkpoint: through a
    link to another folder that would delete files outside the run, so it is refused."""
    out = tmp_path / "run"
    args = ["train", SMOKE, *PEAKS, "train.select=best", "train.save_every=4",
            "--run-dir", str(out), "--quiet"]
    assert forked(args, "kill@step=19") == -9
    outside = tmp_path / "elsewhere"
    (out / "best").rename(outside)
    (out / "best").symlink_to(outside)
    before = sorted(p.name for p in outside.iterdir())
    result = CliRunner().invoke(app, ["train", "--resume", str(out), "--quiet"])
    assert result.exit_code == 2, result.output
    assert result.output.strip() == (
        f"error: run {out} cannot be resumed: its best is a symbolic link to {outside}, and "
        "resuming would write through it; replace the link with a copy of what it points to, "
        "then resume")
    assert sorted(p.name for p in outside.iterdir()) == before == [
        "records.json", "step-0000014", "step-0000018"]


@pytest.mark.e2e
def test_a_run_killed_after_early_stopping_ends_as_it_would_have(in_repo, smoke_runs,
                                                                 tmp_path):
    """Killed while the chosen step is scored again (after the stop's checkpoint): the
    resumed run trains no further and ends with the same step."""
    whole = smoke_runs(SMOKE, *PEAKS, "train.select=best", "train.early_stop_patience=2")
    out = tmp_path / "run"
    args = ["train", SMOKE, *PEAKS, "train.select=best", "train.early_stop_patience=2",
            "--run-dir", str(out), "--quiet"]
    assert forked(args, "kill@chosen=8") == -9  # stopped at 12, about to score 8 again
    assert RunDir.read_status(out)["status"] == "running"
    assert forked(["train", "--resume", str(out), "--quiet"]) == 0
    assert summary(out)["selected"] == summary(whole)["selected"]
    assert read_metrics(out) == read_metrics(whole)
    assert ((out / "adapter_model.safetensors").read_bytes()
            == (whole / "adapter_model.safetensors").read_bytes())


@pytest.mark.e2e
def test_two_processes_agree_on_the_best_and_on_stopping(in_repo, tmp_path):
    """Rank 0 judges each evaluation and every rank learns the outcome: both stop at the
    same step (a rank that trained on would wait forever for the other), and the run ends
    with the step its own rows say was best."""
    out = tmp_path / "run"
    args = ["train", SMOKE, *PEAKS, "train.select=best", "train.early_stop_patience=2",
            "--run-dir", str(out), "--quiet"]
    assert forked_ranks(args, 2) == [0, 0]
    chosen, stop = best_of(eval_rows(out), patience=2)
    selected = summary(out)["selected"]
    assert (selected["step"], selected["stopped_early_at"]) == (chosen, stop)
    row = next(r for r in eval_rows(out) if r["step"] == chosen)
    assert summary(out)["metrics"]["validation"]["loss"] == row["loss"]
    assert max(r["step"] for r in read_metrics(out)) == stop


def train(tmp_path: Path, config: str, *overrides: str):
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        return CliRunner().invoke(app, ["train", config, *overrides, "--run-dir",
                                        str(tmp_path / "run"), "--quiet"])


@pytest.mark.parametrize(("overrides", "message"), [
    (("train.select_metric=acuracy",),
     "train.select_metric acuracy: task sst2 does not report 'acuracy' (it reports "
     "accuracy); name one of them"),
    (("train.select_metric=test/accuracy",),
     "train.select_metric test/accuracy: task sst2 evaluates no split 'test' (it evaluates "
     "validation); name one of them, or the metric alone"),
])
def test_a_metric_the_task_does_not_report_is_refused_before_the_run(tmp_path, overrides,
                                                                      message):
    result = train(tmp_path, "configs/smoke/glue.yaml", "train.select=best", *overrides)
    assert result.exit_code == 2, result.output
    assert result.output.strip() == f"error: {message}"
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("config", "metric", "reported"), [
    ("configs/smoke/squad.yaml", "bleu", "exact_match, f1, HasAns_exact, HasAns_f1, "
     "HasAns_total, NoAns_exact, NoAns_f1, NoAns_total"),
    ("configs/smoke/summarization.yaml", "f1", "rouge1, rouge2, rougeL, rougeLsum"),
])
def test_squad_and_summarization_metrics_are_checked_before_the_run(tmp_path, config, metric,
                                                                     reported):
    """Their metrics are known before any evaluation (squad_scoring's and ROUGE's names), so
    a name they do not report is refused before anything is trained or written."""
    result = train(tmp_path, config, "train.select=best", f"train.select_metric={metric}",
                   "train.eval_every=4")
    assert result.exit_code == 2, result.output
    task = "squad_v2" if "squad" in config else "xsum"
    assert result.output.strip().splitlines()[-1] == (
        f"error: train.select_metric {metric}: task {task} does not report {metric!r} (it "
        f"reports {reported}); name one of them")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("overrides", "start"), [
    (("train.early_stop_patience=2",), "train.early_stop_patience stops on the selection"),
    (("train.select_metric=accuracy",), "train.select_metric=accuracy is read only by"),
    (("train.select=best", "train.eval_every=null"), "train.select=best chooses among the "
                                                     "periodic evaluations"),
    (("train.select=best", "train.early_stop_patience=-1"), "train.early_stop_patience must"),
    (("train.select=first",), "train.select must be one of last, best"),
])
def test_selection_settings_that_mean_nothing_are_refused(tmp_path, overrides, start):
    result = train(tmp_path, "configs/smoke/glue.yaml", *overrides)
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"error: {start}") and result.output.count("\n") == 1
    assert not (tmp_path / "run").exists()


def test_a_task_that_names_its_metrics_only_by_reporting_them_is_checked_at_its_first_eval(
        tmp_path, monkeypatch):
    from adalora_cli.tasks.glue import TextClassificationTask

    monkeypatch.setattr(TextClassificationTask, "metric_names", lambda self: None)
    result = train(tmp_path, "configs/smoke/glue.yaml", "train.select=best",
                   "train.select_metric=acuracy", "train.eval_every=4")
    assert result.exit_code == 2, result.output
    assert ("train.select_metric 'acuracy': task sst2 reports accuracy on validation; name "
            "one of them") in result.output
    status = RunDir.read_status(tmp_path / "run")
    assert status["status"] == "failed"  # never finished-looking
    assert not (tmp_path / "run" / "summary.json").exists()
