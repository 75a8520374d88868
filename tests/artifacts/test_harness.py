"""lm-evaluation-harness on trained runs (``adalora eval --harness``, ``eval.harness``), with
the harness task that ships with adalora (``bbc_topic_chat``) over the BBC chat validation
rows of the smoke config (tiny Llama, offline).

What the harness scores is checked against the run itself: the replies and the exact match
the run's own evaluation wrote (``predictions.jsonl``, ``summary.json``) on the same rows.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from adalora_cli.cli import app
from tests.conftest import ROOT, copy_of

CHAT = "configs/smoke/bbc_topic_chat.yaml"
EIGHT = ("task.max_new_tokens=8",)
"""The shipped harness task generates up to 8 tokens (the LLM demo's task.max_new_tokens)."""
LEARNED = (*EIGHT, "method.name=full", "train.max_steps=80", "train.learning_rate=0.01",
           "task.max_train_samples=null", "task.max_eval_samples=16")
"""A tiny model trained on every topic long enough to answer with topic-like words, some
right and some wrong: an exact match neither 0 nor 100 to agree on."""


def invoke(*args: str):
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        result = CliRunner().invoke(app, [str(a) for a in args])
    return result, [line for line in result.output.splitlines() if line.strip()]


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def own_scores(run: Path) -> tuple[list[dict], dict]:
    summary = json.loads((run / "summary.json").read_text())
    return rows(run / "predictions.jsonl"), summary


def test_harness_task_scores_what_the_runs_own_evaluation_scored(smoke_runs, tmp_path):
    run = copy_of(smoke_runs(CHAT, *LEARNED), tmp_path / "run")
    predictions, summary = own_scores(run)
    own = summary["metrics"]["validation"]["exact_match"]
    assert 0 < own < 100  # some replies right, some wrong
    result, lines = invoke("eval", run, "--harness", "bbc_topic_chat", "--limit",
                           len(predictions), "--quiet")
    assert result.exit_code == 0, result.output
    record = json.loads((run / "harness.json").read_text())
    assert record["adapted"]["bbc_topic_chat"]["exact_match"] == pytest.approx(own, abs=1e-9)
    # row by row: the same prompts (the template's BOS aside), the same greedy replies
    scored = rows(run / "harness" / "adapted-bbc_topic_chat.jsonl")
    assert [r["target"] for r in scored] == [p["reference"] for p in predictions]
    assert [r["response"].strip() for r in scored] == [p["prediction"] for p in predictions]
    assert [r["prompt"].removeprefix("<s>") for r in scored] == [
        p["prompt"] for p in predictions]
    how = record["how"]["adapted"]["bbc_topic_chat"]
    assert (how["rows"], how["limit"], how["chat_template"]) == (16, 16, True)
    assert lines[0] == (f"harness bbc_topic_chat, adapted model: exact_match {own:.4f} "
                        f"(the run's own exact_match {own:.4f})")


def test_lm_evals_advice_for_its_own_command_line_stays_out_of_a_run(smoke_runs, tmp_path,
                                                                      caplog):
    """A run hands lm-eval its model as an object, as lm-eval allows; lm-eval's warnings
    about that (and about task metadata) are for its command line, not for our users."""
    import logging

    run = copy_of(smoke_runs(CHAT, *EIGHT), tmp_path / "run")
    caplog.set_level(logging.WARNING)
    result, lines = invoke("eval", run, "--harness", "bbc_topic_chat", "--limit", 2)
    assert result.exit_code == 0, result.output
    assert not [r for r in caplog.records if r.name.startswith("lm_eval")], caplog.text
    assert "pretrained" not in result.output and "--metadata" not in result.output


def test_base_and_adapted_adalora_scored_and_shown_by_report(smoke_runs, tmp_path):
    run = copy_of(smoke_runs(CHAT, *EIGHT), tmp_path / "run")
    predictions, summary = own_scores(run)
    before = (run / "summary.json").read_bytes()
    result, lines = invoke("eval", run, "--harness", "bbc_topic_chat", "--limit", 8,
                           "--base", "--quiet")
    assert result.exit_code == 0, result.output
    assert [line.split(":")[0] for line in lines[:2]] == [
        "harness bbc_topic_chat, base model", "harness bbc_topic_chat, adapted model"]
    adapted = rows(run / "harness" / "adapted-bbc_topic_chat.jsonl")
    base = rows(run / "harness" / "base-bbc_topic_chat.jsonl")
    # the adapter is put back on the base that was scored first: its replies are the run's
    assert [r["response"].strip() for r in adapted] == [p["prediction"] for p in predictions]
    assert [r["prompt"] for r in base] == [r["prompt"] for r in adapted]
    assert (run / "summary.json").read_bytes() == before  # training results untouched
    report, out = invoke("report", run, "--format", "markdown")
    assert report.exit_code == 0, report.output
    header = next(line for line in out if line.startswith("| Method"))
    assert "lm-eval bbc_topic_chat exact_match" in header


def test_harness_after_training_writes_scores_for_base_and_adapted(tmp_path):
    run = tmp_path / "run"
    result, lines = invoke("train", CHAT, *EIGHT, "method.name=lora", "train.max_steps=2",
                           "task.max_eval_samples=4", "train.eval_at_start=true",
                           "eval.harness=[bbc_topic_chat]", "eval.harness_limit=4",
                           "--run-dir", run, "--quiet")
    assert result.exit_code == 0, result.output
    record = json.loads((run / "harness.json").read_text())
    summary = json.loads((run / "summary.json").read_text())
    assert set(record["base"]) == set(record["adapted"]) == {"bbc_topic_chat"}
    assert record["adapted"]["bbc_topic_chat"]["exact_match"] == pytest.approx(
        summary["metrics"]["validation"]["exact_match"])
    assert record["base"]["bbc_topic_chat"]["exact_match"] == pytest.approx(
        summary["metrics_at_start"]["validation"]["exact_match"])
    shown = [line for line in lines if line.startswith("harness bbc_topic_chat")]
    assert [line.split(":")[0] for line in shown] == [
        "harness bbc_topic_chat, base model", "harness bbc_topic_chat, adapted model"]


def refused(*args) -> str:
    result, lines = invoke(*args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1, result.output
    return errors[0]


def test_harness_on_a_classification_run_is_refused(smoke_runs, tmp_path):
    run = smoke_runs("configs/smoke/glue.yaml", "method.name=lora", "train.max_steps=2")
    line = refused("eval", run, "--harness", "bbc_topic_chat")
    assert "scores a decoder language model" in line
    assert "trains AutoModelForSequenceClassification, not a language model head" in line
    assert not (run / "harness.json").exists()
    target = tmp_path / "never"
    line = refused("train", "configs/smoke/glue.yaml", "eval.harness=[bbc_topic_chat]",
                   "--run-dir", target)
    assert "scores a decoder language model" in line
    assert not target.exists()  # refused before the run directory was made


def test_an_unknown_harness_task_is_refused_before_training(tmp_path):
    target = tmp_path / "never"
    line = refused("train", CHAT, "eval.harness=[bbc_topic_chatt]", "--run-dir", target)
    assert "unknown harness task 'bbc_topic_chatt'" in line
    assert "did you mean bbc_topic_chat?" in line
    assert not target.exists()


def test_harness_options_that_would_be_ignored_are_refused(smoke_runs):
    run = smoke_runs("configs/smoke/glue.yaml", "method.name=lora", "train.max_steps=2")
    line = refused("eval", run, "--harness", "bbc_topic_chat", "task.max_length=64")
    assert "drop 'task.max_length=64'" in line
    line = refused("eval", run, "--limit", 3)
    assert "--limit and --base go with --harness TASKS" in line


def test_without_lm_eval_the_harness_says_how_to_install_it(monkeypatch):
    from adalora_cli.config import ConfigError
    from adalora_cli.tasks.harness import task_manager

    monkeypatch.setitem(sys.modules, "lm_eval.tasks", None)  # import fails as if absent
    with pytest.raises(ConfigError, match=r"pip install 'adalora\[harness\]'"):
        task_manager(["bbc_topic_chat"])
