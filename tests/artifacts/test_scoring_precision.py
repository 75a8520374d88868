"""``adalora eval`` and ``adalora predict`` score in the precision the run's own scores came
from (bf16 autocast and a bf16 base here, forced with ``train.precision=bf16``
``model.base_dtype=auto``, as ``auto`` picks on a CPU with native bf16), so the three agree
row for row; ``train.precision`` / ``--precision`` change it and say so.

Expected values come from the training run itself (its predictions.jsonl and summary.json)
and, for the classifier, from a bf16 forward written out here by hand.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from adalora_cli.artifacts.load import load_run
from adalora_cli.artifacts.scoring import choose
from adalora_cli.cli import app
from adalora_cli.rundir.summary import Summary
from tests.conftest import copy_of
from tests.methods._tiny import run_config

ROOT = Path(__file__).resolve().parents[2]
QA = ROOT / "tests/fixtures/causal_lm/qa/validation.jsonl"
SST2 = ROOT / "tests/fixtures/glue/sst2/validation.jsonl"
BF16 = ["train.precision=bf16", "model.base_dtype=auto"]
# lr 0.01: the tiny Llama then answers with varied tokens, and in fp32 one of its 8
# validation replies differs from the bf16 run's (lr 0.05 answers "." to everything)
RUNS = {"lm": ("configs/smoke/causal_lm.yaml", [*BF16, "train.learning_rate=0.01"]),
        "cls": ("configs/smoke/glue.yaml", [*BF16, "train.eval_every=null"])}
AS_RUN = "scoring on cpu in bf16 autocast (base weights in bf16), as the run scored"


def invoke(*args: str):
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        return CliRunner().invoke(app, list(args))


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def runs(smoke_runs, tmp_path_factory):
    """Copies: ``adalora eval`` writes into the run's eval/ folder."""
    root = tmp_path_factory.mktemp("bf16-runs")
    return {name: copy_of(smoke_runs(config, *overrides), root / name)
            for name, (config, overrides) in RUNS.items()}


def test_the_runs_are_bf16(runs):
    for run in runs.values():
        precision = json.loads((run / "summary.json").read_text())["precision"]
        assert (precision["autocast"], precision["base_dtype"]) == ("bf16", "bf16")


def test_lm_predict_eval_and_the_runs_own_predictions_agree_row_for_row(runs, tmp_path):
    run, out = runs["lm"], tmp_path / "replies.jsonl"
    own = rows(run / "predictions.jsonl")
    result = invoke("predict", str(run), "-i", str(QA), "-o", str(out))
    assert result.exit_code == 0, result.output
    assert AS_RUN in result.stderr and "--precision fp32 for full precision" in result.stderr
    assert [r["response"] for r in rows(out)] == [r["prediction"] for r in own]

    result = invoke("eval", str(run), "--name", "again")
    assert result.exit_code == 0, result.output
    assert AS_RUN in result.stderr and "train.precision=fp32 for full precision" in result.stderr
    assert rows(run / "eval" / "again" / "predictions.jsonl") == own
    saved = json.loads((run / "eval" / "again.json").read_text())
    summary = json.loads((run / "summary.json").read_text())
    assert saved["metrics"] == summary["metrics"]  # the loss to the last bit, not approx
    assert saved["precision"] == {"device": "cpu", "autocast": "bf16", "base_dtype": "bf16",
                                  "as_run": True}


def test_fp32_is_asked_for_and_said(runs, tmp_path):
    run = runs["lm"]
    result = invoke("eval", str(run), "--name", "full", "train.precision=fp32")
    assert result.exit_code == 0, result.output
    assert ("scoring on cpu in fp32 (train.precision=fp32); the run's own scores came from "
            "bf16 autocast (base weights in bf16)") in result.stderr
    saved = json.loads((run / "eval" / "full.json").read_text())
    assert saved["precision"] == {"device": "cpu", "autocast": "fp32", "base_dtype": "fp32",
                                  "as_run": False}
    trained = json.loads((run / "summary.json").read_text())["metrics"]["validation"]
    # the same weights in fp32: the loss moves, in the fourth significant digit at most
    assert saved["metrics"]["validation"]["loss"] != trained["loss"]
    assert saved["metrics"]["validation"]["loss"] == pytest.approx(trained["loss"], rel=1e-3)

    out = tmp_path / "fp32.jsonl"
    result = invoke("predict", str(run), "-i", str(QA), "-o", str(out), "--precision", "fp32")
    assert result.exit_code == 0, result.output
    assert "scoring on cpu in fp32 (--precision fp32)" in result.stderr
    assert len(rows(out)) == len(rows(QA))


@torch.no_grad()
def _bf16_probs(run: Path, sentences: list[str]) -> np.ndarray:
    """The run's class probabilities as its evaluation computed them: the frozen weights
    rounded to bf16, the trained ones fp32, every forward under bf16 autocast."""
    model, tok, _ = load_run(run)  # all fp32
    for p in model.parameters():
        if not p.requires_grad:
            p.data = p.data.to(torch.bfloat16)
    enc = tok(sentences, padding=True, truncation=True, max_length=32, return_tensors="pt")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model.eval()(**enc).logits
    return logits.float().softmax(-1).numpy()


def test_classifier_predict_scores_as_its_evaluation_did(runs, tmp_path):
    run, names = runs["cls"], ["negative", "positive"]
    data = rows(SST2)
    expected = _bf16_probs(run, [r["sentence"] for r in data])
    scores = {}
    for precision in ("run", "fp32"):
        out = tmp_path / f"{precision}.jsonl"
        extra = ["--precision", "fp32"] if precision == "fp32" else []
        result = invoke("predict", str(run), "-i", str(SST2), "-o", str(out), "--quiet", *extra)
        assert result.exit_code == 0, result.output
        scores[precision] = np.array([[r["scores"][n] for n in names] for r in rows(out)])
        if precision == "run":
            labels = [r["label"] for r in rows(out)]
    # predict rounds to 6 decimals; fp32 is further off than that
    assert np.abs(scores["run"] - expected).max() <= 1e-6
    assert np.abs(scores["fp32"] - expected).max() > 1e-5
    assert labels == [names[i] for i in expected.argmax(-1)]
    accuracy = float(np.mean([names.index(y) == r["label"] for y, r in zip(labels, data)]))
    result = invoke("eval", str(run), "--quiet")
    assert result.exit_code == 0, result.output
    saved = json.loads((run / "eval" / "default.json").read_text())
    summary = json.loads((run / "summary.json").read_text())
    assert saved["metrics"] == summary["metrics"]
    assert saved["metrics"]["validation"]["accuracy"] == accuracy


def test_export_says_the_precision_that_reproduces_the_run(runs, tmp_path):
    result = invoke("export", str(runs["lm"]), str(tmp_path / "peft"))
    assert result.exit_code == 0, result.output
    assert "precision.json: the run scored in bf16 autocast (base weights in bf16)" in (
        result.output)
    record = json.loads((tmp_path / "peft" / "precision.json").read_text())
    assert (record["autocast"], record["base_dtype"], record["device"]) == ("bf16", "bf16",
                                                                           "cpu")
    assert ("load the base with dtype=torch.bfloat16 and call the model under "
            "torch.autocast('cpu', dtype=torch.bfloat16)") in record["how"]


CPU = torch.device("cpu")


def test_a_precision_the_device_cannot_run_falls_back_to_fp32_and_says_so():
    cfg = run_config("lora")
    fp16 = Summary(task="rte", method="lora", device="cuda:0",
                   precision={"autocast": "fp16", "base_dtype": "fp16"})
    scoring = choose(cfg, fp16, CPU, None, lambda v: f"--precision {v}")
    assert (scoring.precision, scoring.base_dtype, scoring.as_run) == ("fp32", torch.float32,
                                                                      False)
    assert scoring.line.startswith("scoring on cpu in fp32 (cpu does not run fp16 autocast); "
                                   "the run's own scores came from fp16 autocast (base "
                                   "weights in fp16)")
    # bf16 asked of an fp32 run: bf16 autocast over the fp32 base it had
    fp32 = Summary(task="rte", method="lora", precision={"autocast": "fp32",
                                                          "base_dtype": "fp32"})
    scoring = choose(cfg, fp32, CPU, "bf16", lambda v: f"--precision {v}")
    assert (scoring.precision, scoring.base_dtype, scoring.as_run) == ("bf16", torch.float32,
                                                                      False)
    # a summary from before the record: the run's config, resolved here
    old = Summary(task="rte", method="lora")
    scoring = choose(run_config("lora", train={"precision": "fp32"}), old, CPU, None, str)
    assert (scoring.precision, scoring.as_run, scoring.line) == (
        "fp32", True, "scoring on cpu in fp32, as the run scored")
