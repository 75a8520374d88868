"""Training-loop arithmetic: T, the learning-rate schedule, and gradient accumulation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from adalora_cli.cli import app
from adalora_cli.config import RunConfig, TrainConfig
from adalora_cli.engine.schedule import linear_schedule, total_steps
from adalora_cli.rundir.run import read_metrics


def cfg_with(**train) -> RunConfig:
    return RunConfig(train=TrainConfig(**train))


@pytest.mark.parametrize("n, batch, accum, epochs, max_steps, expected", [
    (2490, 32, 1, 50, None, 78 * 50),     # RTE: ceil(2490 / 32) = 78 steps an epoch
    (392702, 32, 1, 7, None, 12272 * 7),  # MNLI
    (100, 8, 2, 3, None, 7 * 3),          # ceil(100 / 16) = 7 optimizer steps an epoch
    (100, 8, 1, 0.5, None, 7),            # ceil(13 * 0.5)
    (100, 8, 1, 3, 5, 5),                 # max_steps wins
])
def test_total_steps(n, batch, accum, epochs, max_steps, expected):
    cfg = cfg_with(batch_size=batch, grad_accum=accum, epochs=epochs, max_steps=max_steps)
    assert total_steps(n, cfg) == expected


def test_linear_schedule_warms_up_then_decays_to_zero():
    f = linear_schedule(warmup=4, total=12)
    # LambdaLR calls f(0) for the first step; warm-up reaches 1 at the 4th step
    assert [f(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert f(4) == 1.0 and f(8) == 0.5 and f(12) == 0.0
    assert linear_schedule(0, 10)(5) == 0.5


def test_gradient_accumulation_counts_optimizer_steps(tmp_path, in_repo):
    out = tmp_path / "run"
    # 64 examples, micro-batch 8, accum 2 -> 4 optimizer steps an epoch, 4 epochs -> T = 16
    result = CliRunner().invoke(app, [
        "train", "configs/smoke/glue.yaml", "train.grad_accum=2", "adalora.t_init=2",
        "adalora.t_final=4", "adalora.delta_t=1", "train.eval_every=null", "--run-dir",
        str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    summary = json.loads((Path(out) / "summary.json").read_text())
    assert summary["total_steps"] == 16
    rows = [r for r in read_metrics(out) if "loss" in r]
    assert [r["step"] for r in rows] == list(range(1, 17))
    assert rows[-1]["budget"] == 16
    # the rate each step used: warm-up over 2 steps (1/2, then 1), then linear decay that
    # would reach 0 at T: step t uses base * (16 - (t - 1)) / 14
    assert [r["lr"] for r in rows[:3]] == pytest.approx([0.0025, 0.005, 0.005 * 14 / 14])
    assert rows[8]["lr"] == pytest.approx(0.005 * (16 - 8) / 14)
    assert rows[-1]["lr"] == pytest.approx(0.005 * 1 / 14)


def test_eval_at_start_scores_the_pretrained_model_and_scores_print_as_they_come(
        tmp_path, in_repo):
    """train.eval_at_start evaluates before step 1: every method starts as the identity
    (LoRA's B = 0), so the scores are those of the pretrained model with its fresh head,
    computed here with plain transformers calls. Scores of evaluations before the end
    print as they come; the end prints what the run cost and trained."""
    import torch
    from transformers import AutoTokenizer

    from adalora_cli.config import load_config
    from adalora_cli.engine.build import seed_everything
    from adalora_cli.tasks import get_task

    out = tmp_path / "run"
    args = ["method.name=lora", "train.max_steps=4", "train.eval_every=2",
            "train.eval_at_start=true"]
    result = CliRunner().invoke(app, ["train", "configs/smoke/glue.yaml", *args,
                                      "--run-dir", str(out)], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    evals = [r for r in read_metrics(out) if "split" in r]
    assert [r["step"] for r in evals] == [0, 2, 4]

    cfg = load_config("configs/smoke/glue.yaml", args)
    seed_everything(cfg.train.seed)  # the head is drawn as the run drew it
    model, _ = get_task(cfg).build_model()
    tok = AutoTokenizer.from_pretrained(cfg.model.name_or_path)
    rows = [json.loads(line) for line in
            Path("tests/fixtures/glue/sst2/validation.jsonl").read_text().splitlines()]
    model.eval()
    with torch.no_grad():
        right = sum(int(model(**tok(r["sentence"], return_tensors="pt")).logits.argmax())
                    == r["label"] for r in rows)
    assert evals[0]["accuracy"] == pytest.approx(right / len(rows))

    lines = result.output.splitlines()
    assert f"step 0/4  validation: accuracy {evals[0]['accuracy']:.4f}" in lines
    assert f"step 2/4  validation: accuracy {evals[1]['accuracy']:.4f}" in lines
    assert not any(line.startswith("step 4/4  validation") for line in lines)  # printed last
    summary = json.loads((out / "summary.json").read_text())
    end = next(line for line in lines if line.startswith("4 steps in "))
    assert (f"trained {summary['trainable_params']:,} parameters "
            f"({summary['adapter_params']:,} adapter + {summary['head_params']:,} head)") in end
    assert "peak memory" in end
