"""The loop's own rows: a non-finite loss stops the run before it reaches metrics.jsonl,
naming the causes that apply to the run."""

from __future__ import annotations

import math

import pytest
import torch

from adalora_cli.engine.loop import _train_row
from adalora_cli.engine.step import StepLog, Stepper
from adalora_cli.methods.allocator import StepReport
from adalora_cli.methods.base import MethodHandle


def _stepper(dtype=torch.float32, scaler=False, lr=3e-3) -> Stepper:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4).to(dtype), torch.nn.Linear(4, 2))
    model[0].requires_grad_(False)
    head = list(model[1].parameters())
    opt = torch.optim.AdamW(head, lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 0.5)  # the step's lr is 1.5e-3
    return Stepper(model, MethodHandle("lora", [], head), opt, sched,
                   torch.amp.GradScaler("cpu", enabled=scaler))


def test_a_non_finite_loss_fails_before_its_row_is_written():
    with pytest.raises(FloatingPointError) as err:
        _train_row(7, math.nan, StepLog(1e-3), None, _stepper())
    # an fp32 model without a loss scaler: the learning rate (as configured) is all that is left
    assert str(err.value) == ("loss became nan at step 7; likely causes: "
                              "train.learning_rate=0.003 is too high (lower it)")
    assert _train_row(7, 0.1234567, StepLog.of(1e-3, StepReport(12)), None, _stepper()) == {
        "step": 7, "loss": 0.123457, "lr": 1e-3, "budget": 12}


def test_the_non_finite_message_names_half_precision_weights_and_fp16_overflow():
    with pytest.raises(FloatingPointError) as err:
        _train_row(2, math.inf, StepLog(1e-3), None,
                   _stepper(torch.float16, scaler=True, lr=1e-4))
    assert str(err.value) == (
        "loss became inf at step 2; likely causes: the model holds float16 weights (set "
        "model.base_dtype=fp32); fp16 autocast overflowed (set train.precision=bf16 or fp32); "
        "train.learning_rate=0.0001 is too high (lower it)")
    with pytest.raises(FloatingPointError, match="holds bfloat16 weights") as err:
        _train_row(2, math.nan, StepLog(1e-3), None, _stepper(torch.bfloat16))
    assert "overflowed" not in str(err.value)
