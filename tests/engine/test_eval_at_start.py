"""train.eval_at_start scores the model before step 1 and changes nothing else; method none
evaluates the model as loaded and trains nothing. Each is checked against the other: the
step-0 scores of an AdaLoRA run (Delta W = 0 at the start) are the scores of the untouched
base, which the none run computes without any adapter attached."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from adalora_cli.artifacts.export import export_run
from adalora_cli.cli import app
from adalora_cli.rundir.run import read_metrics
from tests.conftest import FIXTURES, copy_of

SMOKE = "configs/smoke/causal_lm.yaml"


def _summary(run):
    return json.loads((run / "summary.json").read_text())


def test_the_start_scores_are_the_base_models_and_the_run_is_unchanged(smoke_runs):
    plain = smoke_runs(SMOKE)
    start = smoke_runs(SMOKE, "train.eval_at_start=true")
    base = smoke_runs(SMOKE, "method.name=none")
    at_zero = [r for r in read_metrics(start) if r["step"] == 0]
    base_scores = _summary(base)["metrics"]["validation"]
    assert at_zero == [{"step": 0, "split": "validation", **base_scores}]
    assert _summary(start)["metrics_at_start"] == _summary(base)["metrics"]
    # the trained run itself: same numbers, same weights, same identity
    assert _summary(start)["metrics"] == _summary(plain)["metrics"]
    assert ((start / "adapter_model.safetensors").read_bytes()
            == (plain / "adapter_model.safetensors").read_bytes())
    assert _summary(start)["config_digest"] == _summary(plain)["config_digest"]
    assert [r for r in read_metrics(start) if r["step"] > 0] == list(read_metrics(plain))
    assert "metrics_at_start" not in _summary(plain)


def test_the_start_scores_are_printed(tmp_path, in_repo):
    result = CliRunner().invoke(app, ["train", SMOKE, "train.eval_at_start=true",
                                      "method.name=lora", "train.max_steps=2",
                                      "--run-dir", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    start = _summary(tmp_path / "r")["metrics_at_start"]["validation"]
    shown = "  ".join(f"{k} {v:.4f}" for k, v in start.items())
    lines = result.output.splitlines()
    # once when measured (a plain line off a terminal), as every evaluation before the end
    assert lines.count(f"step 0/2  validation: {shown}") == 1, result.output
    # and again just before the final scores, which it precedes
    final = _summary(tmp_path / "r")["metrics"]["validation"]
    at = lines.index(f"validation before training: {shown}")
    assert lines[at + 1] == "validation: " + "  ".join(f"{k} {v:.4f}" for k, v in final.items())


def test_method_none_trains_nothing_and_keeps_the_base(smoke_runs, tmp_path):
    run = smoke_runs(SMOKE, "method.name=none")
    summary = _summary(run)
    assert (summary["total_steps"], summary["adapter_params"], summary["head_params"]) == (
        0, 0, 0)
    assert [r for r in read_metrics(run) if "loss" in r and "split" not in r] == []
    assert load_file(str(run / "adapter_model.safetensors")) == {}
    assert len((run / "predictions.jsonl").read_text().splitlines()) == 8
    # its merged export is the base checkpoint, weight for weight
    export_run(run, "merged", tmp_path / "merged")
    got = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").state_dict()
    want = AutoModelForCausalLM.from_pretrained(FIXTURES / "tiny-llama").state_dict()
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_method_none_has_no_peft_form(smoke_runs, tmp_path):
    run = smoke_runs(SMOKE, "method.name=none")
    result = CliRunner().invoke(app, ["export", str(run), str(tmp_path / "p")])
    assert result.exit_code == 2
    assert "PEFT has no format for method 'none'" in result.output
    assert "use --format merged" in result.output


@pytest.mark.parametrize("method", ["bitfit"])
def test_a_method_with_nothing_to_train_is_refused(method, tmp_path, in_repo):
    # Llama has no biases: BitFit finds nothing (before, AdamW failed on an empty list)
    result = CliRunner().invoke(app, ["train", SMOKE, f"method.name={method}",
                                      "--run-dir", str(tmp_path / "r")])
    assert result.exit_code == 2, result.output
    *header, error = result.output.strip().splitlines()
    assert [line.split()[0] for line in header] == ["train", "device", "loading"]  # the run's
    assert error == (f"error: method {method} finds nothing to train in LlamaForCausalLM; "
                     "choose another method.name")
    assert not (tmp_path / "r").exists()


def test_the_report_shows_the_base_model_as_a_row_of_its_own(smoke_runs, tmp_path):
    copy_of(smoke_runs(SMOKE, "method.name=none"), tmp_path / "runs" / "base")
    copy_of(smoke_runs(SMOKE), tmp_path / "runs" / "adalora")
    result = CliRunner().invoke(app, ["report", str(tmp_path / "runs"), "--format",
                                      "markdown"])
    assert result.exit_code == 0, result.output
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[1:-1]]
            for line in result.output.splitlines() if line.startswith("| ")}
    assert rows["Base model"][1] == "0"  # # Params: nothing trained
    base_loss = _summary(tmp_path / "runs/base")["metrics"]["validation"]["loss"]
    assert rows["Base model"][3].strip("*").startswith(f"{base_loss:.2f}")
    cost = [line for line in result.output.splitlines() if "| causal_lm | Base model |" in line]
    assert [c.strip() for c in cost[0].split("|")[1:-1]][5] == ""  # no time per epoch
