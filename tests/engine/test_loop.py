"""The loop's own rows, and a non-finite loss without loss scaling: it stops the run before
the optimizer step and before its row reaches metrics.jsonl, naming the causes that apply."""

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


def test_a_non_finite_loss_fails_before_the_optimizer_step():
    stepper = _stepper()
    x = torch.ones(2, 4)
    stepper.model(x).sum().backward()
    before = [p.detach().clone() for p in stepper.handle.trainable]
    with pytest.raises(FloatingPointError) as err:
        stepper.update(7, math.nan)
    # an fp32 model without a loss scaler: the learning rate (as configured) is all that is left
    assert str(err.value) == ("loss became nan at step 7; likely causes: "
                              "train.learning_rate=0.003 is too high (lower it)")
    assert all(torch.equal(p, q) for p, q in zip(stepper.handle.trainable, before))
    assert _train_row(7, 0.1234567, StepLog.of(1e-3, StepReport(12)), None, "orth_reg") == {
        "step": 7, "loss": 0.123457, "lr": 1e-3, "budget": 12}
    reg = torch.tensor(0.25)
    assert _train_row(7, 0.5, StepLog(1e-3), reg, "gate_l1") == {
        "step": 7, "loss": 0.5, "lr": 1e-3, "gate_l1": 0.25}


def test_the_non_finite_message_names_half_precision_weights():
    with pytest.raises(FloatingPointError) as err:
        _stepper(torch.float16, lr=1e-4).update(2, math.inf)
    assert str(err.value) == (
        "loss became inf at step 2; likely causes: the model holds float16 weights (set "
        "model.base_dtype=fp32); train.learning_rate=0.0001 is too high (lower it)")
    with pytest.raises(FloatingPointError, match="holds bfloat16 weights") as err:
        _stepper(torch.bfloat16).update(2, math.nan)
    assert "overflowed" not in str(err.value)


def test_a_skipped_step_s_row_has_a_null_loss_and_says_skipped():
    """Only a step the fp16 loss scaler skipped reaches the row with a non-finite loss."""
    log = StepLog.of(1e-3, StepReport(12), skipped=True)
    assert _train_row(3, math.inf, log, None, "orth_reg") == {"step": 3, "loss": None, "lr": 1e-3,
                                                              "budget": 12, "skipped": True}
    assert _train_row(3, 0.5, StepLog(1e-3, skipped=True), None, "orth_reg") == {
        "step": 3, "loss": 0.5, "lr": 1e-3, "skipped": True}


def test_the_loop_reads_as_one_story():
    """``_loop`` stays one readable function: its setup is :func:`loop.setup`, its state one
    object (``LoopState``, whose methods are what each step boundary does), and it defines
    no closures. It had grown to 157 lines with four closures sharing its locals."""
    import ast
    from pathlib import Path

    from adalora_cli.engine import loop

    tree = ast.parse(Path(loop.__file__).read_text())
    body = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_loop")
    inner = [n for n in ast.walk(body) if n is not body
             and isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
    assert inner == []
    assert body.end_lineno - body.lineno + 1 <= 100
    setup = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "setup")
    assert ast.unparse(setup.returns) == "LoopState"
