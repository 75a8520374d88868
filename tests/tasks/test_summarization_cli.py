"""`adalora train configs/smoke/summarization.yaml` end to end: the run directory holds
ROUGE, predictions, the rank pattern and a heatmap with encoder and decoder layers."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from adalora_cli.cli import app
from adalora_cli.rundir.run import is_finished, read_metrics
from tests.conftest import FIXTURES

SMOKE = "configs/smoke/summarization.yaml"
ROUGE_KEYS = {"rouge1", "rouge2", "rougeL", "rougeLsum"}
runner = CliRunner()


def train(out, *overrides: str) -> dict:
    result = runner.invoke(app, ["train", SMOKE, *overrides, "--run-dir", str(out), "--quiet"],
                           catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads((out / "summary.json").read_text())


def validation_rows(name: str = "xsum") -> list[dict]:
    path = FIXTURES / "summarization" / name / "validation.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def adalora_run(smoke_runs):
    out = smoke_runs(SMOKE)
    return out, json.loads((out / "summary.json").read_text())


def test_run_directory_has_rouge_predictions_and_ranks(adalora_run):
    out, summary = adalora_run
    names = {p.name for p in out.iterdir()}
    assert {"summary.json", "predictions.jsonl", "rank_pattern.json", "rank_heatmap.png",
            "metrics.jsonl", "adapter_model.safetensors"} <= names
    assert is_finished(out)
    assert (summary["task"], summary["method"], summary["total_steps"]) == ("xsum", "adalora", 16)
    assert summary["n_matrices"] == 32  # 2 x 6 encoder + 2 x 10 decoder matrices
    metrics = summary["metrics"]["validation"]
    assert set(metrics) == ROUGE_KEYS and all(0 <= v <= 100 for v in metrics.values())
    evals = [r for r in read_metrics(out) if r.get("split") == "validation"]
    assert len(evals) == 1 and set(evals[0]) == {"step", "split", *ROUGE_KEYS}


def test_predictions_cover_every_validation_example(adalora_run):
    out, _ = adalora_run
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    expected = validation_rows()
    assert [r["id"] for r in rows] == [e["id"] for e in expected]
    assert [r["reference"] for r in rows] == [e["summary"] for e in expected]
    assert all(isinstance(r["prediction"], str) and r["prediction"] for r in rows)


def test_rank_pattern_spans_encoder_decoder_and_cross_attention(adalora_run):
    out, _ = adalora_run
    pattern = json.loads((out / "rank_pattern.json").read_text())
    assert len(pattern) == 32 and sum(pattern.values()) == 32  # b(T) = 32
    assert sum(".encoder_attn." in p for p in pattern) == 8  # 2 decoder layers x 4
    assert sum(".encoder.layers." in p for p in pattern) == 12
    assert (out / "rank_heatmap.png").read_bytes()[:4] == b"\x89PNG"


def test_lora_run(tmp_path, in_repo):
    summary = train(tmp_path / "lora", "method.name=lora", "train.epochs=1")
    assert summary["method"] == "lora" and summary["total_steps"] == 4
    # LoRA r = 1 on 32 matrices: d_in + d_out each; d_model 32, FFN 37
    per_pair = 12 * (32 + 32) + 4 * (32 + 37)  # 12 attention, 4 FFN matrices per layer pair
    assert summary["adapter_params"] == 2 * per_pair
    assert set(summary["metrics"]["validation"]) == ROUGE_KEYS
    assert not (tmp_path / "lora" / "rank_pattern.json").exists()
    assert (tmp_path / "lora" / "predictions.jsonl").exists()
