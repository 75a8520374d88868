"""``adalora eval`` and ``adalora predict`` on runs trained through the CLI (tiny fixtures).

Expected values come from elsewhere: the metrics and predictions the training run itself
wrote at its final evaluation, and logits computed here from the rebuilt model.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from adalora_cli.artifacts.load import load_run
from adalora_cli.cli import app
from tests.conftest import copy_of

ROOT = Path(__file__).resolve().parents[2]
SST2 = ROOT / "tests/fixtures/glue/sst2/validation.jsonl"
XSUM = ROOT / "tests/fixtures/summarization/xsum/validation.jsonl"
SQUAD = ROOT / "tests/fixtures/squad/v2/validation.jsonl"

RUNS = {
    "glue": ("configs/smoke/glue.yaml", ["train.max_steps=12", "adalora.t_init=2",
                                         "adalora.t_final=4", "train.eval_every=null"]),
    "sum": ("configs/smoke/summarization.yaml", ["method.name=lora", "train.max_steps=2",
                                                 "task.max_eval_samples=6"]),
    "squad": ("configs/smoke/squad.yaml", ["method.name=lora", "train.max_steps=3",
                                           "train.eval_every=null"]),
}


def invoke(*args: str):
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        return CliRunner().invoke(app, list(args))


@pytest.fixture(scope="module")
def runs(smoke_runs, tmp_path_factory):
    """Copies: ``adalora eval`` writes its scores into the run's eval/ folder."""
    root = tmp_path_factory.mktemp("runs")
    return {name: copy_of(smoke_runs(config, *overrides), root / name)
            for name, (config, overrides) in RUNS.items()}


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_eval_rescores_the_validation_split_without_touching_training_results(runs):
    run = runs["glue"]
    before = {f: digest(run / f) for f in ("summary.json", "metrics.jsonl", "status.json")}
    result = invoke("eval", str(run), "--quiet")
    assert result.exit_code == 0, result.output
    saved = json.loads((run / "eval" / "default.json").read_text())
    summary = json.loads((run / "summary.json").read_text())
    assert saved["metrics"] == summary["metrics"]  # the same model on the same split
    assert {f: digest(run / f) for f in before} == before


@torch.no_grad()
def test_eval_on_other_data_scores_that_file(runs, tmp_path):
    run = runs["glue"]
    data = rows(SST2)[:12]
    for r in data[::3]:
        r["label"] = 1 - r["label"]  # a different labelling: a different accuracy
    mine = tmp_path / "my_dev.jsonl"
    mine.write_text("".join(json.dumps(r) + "\n" for r in data))
    result = invoke("eval", str(run), f"task.data_files.validation={mine}", "--quiet")
    assert result.exit_code == 0, result.output
    saved = json.loads((run / "eval" / "my_dev.json").read_text())
    model, tok, _ = load_run(run)
    enc = tok([r["sentence"] for r in data], padding=True, truncation=True, max_length=32,
              return_tensors="pt")
    preds = model.eval()(**enc).logits.argmax(-1).numpy()
    expected = float(np.mean(preds == np.array([r["label"] for r in data])))
    assert saved["metrics"]["validation"]["accuracy"] == pytest.approx(expected)
    assert saved["data"]["validation_examples"] == 12
    assert saved["data"]["validation_source"] == str(mine)


def test_report_shows_eval_scores(runs, tmp_path):
    mine = tmp_path / "flipped.jsonl"
    mine.write_text("".join(json.dumps({**r, "label": 1 - r["label"]}) + "\n"
                            for r in rows(SST2)))
    result = invoke("eval", str(runs["glue"]), f"task.data_files.validation={mine}", "--quiet")
    assert result.exit_code == 0, result.output
    accuracy = json.loads((runs["glue"] / "eval" / "flipped.json").read_text())["metrics"][
        "validation"]["accuracy"]
    trained = json.loads((runs["glue"] / "summary.json").read_text())["metrics"]["validation"]
    assert accuracy == pytest.approx(1 - trained["accuracy"])  # every label flipped
    result = invoke("report", str(runs["glue"].parent), "--eval", "flipped", "--format", "csv")
    assert result.exit_code == 0, result.output
    assert f"{accuracy * 100:.2f}" in result.output
    assert "skipped" in result.output and "no eval/flipped.json" in result.output


def test_eval_keeps_squad_predictions_apart(runs):
    run = runs["squad"]
    before = digest(run / "predictions.json")
    result = invoke("eval", str(run), "--name", "again", "--quiet")
    assert result.exit_code == 0, result.output
    again = json.loads((run / "eval" / "again" / "predictions.json").read_text())
    assert again == json.loads((run / "predictions.json").read_text())
    assert digest(run / "predictions.json") == before
    saved = json.loads((run / "eval" / "again.json").read_text())
    summary = json.loads((run / "summary.json").read_text())
    assert saved["metrics"] == summary["metrics"]


def test_eval_bad_input_is_one_line(runs, tmp_path):
    for args, message in [
        ((str(runs["glue"]), "lora.r=4"), "eval takes task.*"),
        ((str(runs["glue"]), "task.name=rte"), "task.name cannot change"),
        ((str(tmp_path / "nowhere"),), "does not exist"),
        ((str(runs["glue"]), "task.data_files.validation=/no/such.tsv"), "does not exist"),
    ]:
        result = invoke("eval", *args, "--quiet")
        assert result.exit_code == 2, result.output
        assert message in result.output and len(result.output.strip().splitlines()) == 1


@torch.no_grad()
def test_predict_classification_labels_and_scores(runs, tmp_path):
    run, out = runs["glue"], tmp_path / "pred.jsonl"
    result = invoke("predict", str(run), "--input", str(SST2), "--output", str(out),
                    "--batch-size", "5", "--quiet")
    assert result.exit_code == 0, result.output
    got, data = rows(out), rows(SST2)
    assert [r["id"] for r in got] == list(range(len(data)))
    model, tok, _ = load_run(run)
    enc = tok([r["sentence"] for r in data], padding=True, truncation=True, max_length=32,
              return_tensors="pt")
    probs = model.eval()(**enc).logits.softmax(-1)
    names = ["negative", "positive"]
    assert [r["label"] for r in got] == [names[i] for i in probs.argmax(-1).tolist()]
    scores = torch.tensor([[r["scores"][n] for n in names] for r in got])
    assert torch.allclose(scores, probs, atol=1e-5)
    # the accuracy of these labels is the run's own validation accuracy
    accuracy = np.mean([names.index(r["label"]) == d["label"] for r, d in zip(got, data)])
    summary = json.loads((run / "summary.json").read_text())
    assert accuracy == pytest.approx(summary["metrics"]["validation"]["accuracy"])


def test_predict_answers_match_the_runs_own_squad_predictions(runs, tmp_path):
    run, out = runs["squad"], tmp_path / "answers.jsonl"
    result = invoke("predict", str(run), "--input", str(SQUAD), "--output", str(out),
                    "--batch-size", "7", "--quiet")
    assert result.exit_code == 0, result.output
    expected = json.loads((run / "predictions.json").read_text())
    assert {r["id"]: r["answer"] for r in rows(out)} == expected


def test_predict_summaries_match_the_runs_own_generation(runs, tmp_path):
    run, out = runs["sum"], tmp_path / "summaries.jsonl"
    source = tmp_path / "articles.jsonl"
    source.write_text("".join(json.dumps({"id": r["id"], "document": r["document"]}) + "\n"
                              for r in rows(XSUM)[:6]))
    result = invoke("predict", str(run), "--input", str(source), "--output", str(out),
                    "--batch-size", "8", "--quiet")
    assert result.exit_code == 0, result.output
    expected = {r["id"]: r["prediction"] for r in rows(run / "predictions.jsonl")}
    got = {str(r["id"]): r["summary"] for r in rows(out)}
    assert got == expected and len(got) == 6


def test_predict_bad_input_leaves_no_output(runs, tmp_path):
    out = tmp_path / "p.jsonl"
    result = invoke("predict", str(runs["glue"]), "--input", str(XSUM), "--output", str(out))
    assert result.exit_code == 2 and "lacks column 'sentence'" in result.output
    assert list(tmp_path.iterdir()) == []
    out.write_text("keep me\n")
    result = invoke("predict", str(runs["glue"]), "--input", str(SST2), "--output", str(out))
    assert result.exit_code == 2 and "already exists" in result.output
    assert out.read_text() == "keep me\n"


@pytest.mark.parametrize("device, expected", [
    ("tpu", "--device 'tpu' is not a device; use auto, cpu, cuda or cuda:N"),
    ("cuda:1", "--device cuda:1 but CUDA is not available; use --device cpu (or auto)"),
])
def test_predict_device_errors_name_the_option(runs, tmp_path, device, expected):
    if device.startswith("cuda") and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = tmp_path / "p.jsonl"
    result = invoke("predict", str(runs["glue"]), "--input", str(SST2), "--output", str(out),
                    "--device", device)
    assert result.exit_code == 2
    assert result.output.strip() == f"error: {expected}"  # not train.device, a config key
    assert list(tmp_path.iterdir()) == []
