"""``Stepper`` on a tiny linear layer, in process: the weights after its optimizer steps
equal AdamW written out by hand (gradients from the closed form of the squared error, not
autograd), with the regularizer, gradient accumulation, clipping and the loss scaler."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from adalora_cli.engine.step import StepLog, Stepper
from adalora_cli.methods.allocator import StepReport
from adalora_cli.methods.base import MethodHandle

LR, BETAS, EPS, WD = 0.1, (0.9, 0.99), 1e-3, 0.01
GAMMA = 0.5  # the regularizer's weight


class Squared(nn.Module):
    """``model(**batch).loss``, as a transformers model gives it: the mean squared error."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2)
        with torch.no_grad():
            self.lin.weight.copy_(torch.tensor([[0.5, -0.25, 0.125], [0.75, 0.5, -1.0]]))
            self.lin.bias.copy_(torch.tensor([0.1, -0.2]))

    def forward(self, x, y):
        return SimpleNamespace(loss=((self.lin(x) - y) ** 2).mean())


BATCHES = [  # two micro-batches of two rows
    {"x": torch.tensor([[1.0, 2.0, -1.0], [0.5, -1.5, 2.0]]), "y": torch.tensor([[1.0, 0.0],
                                                                              [-1.0, 2.0]])},
    {"x": torch.tensor([[-2.0, 0.5, 1.0], [3.0, 1.0, 0.0]]), "y": torch.tensor([[0.5, 0.5],
                                                                             [2.0, -3.0]])},
]


def grads(w, b, batch, reg: bool):
    """d/dW and d/db of mean((x W^T + b - y)^2) (+ GAMMA * sum(W^2) with ``reg``)."""
    x, y = batch["x"], batch["y"]
    r = x @ w.T + b - y
    n = r.numel()
    gw, gb = 2 / n * r.T @ x, 2 / n * r.sum(0)
    if reg:
        gw = gw + GAMMA * 2 * w
    return gw, gb


def adamw(params, gs, state, lr, t):
    """One AdamW step (decoupled weight decay, bias-corrected moments), by the formula."""
    b1, b2 = BETAS
    out = []
    for i, (p, g) in enumerate(zip(params, gs)):
        m, v = state.get(i, (torch.zeros_like(p), torch.zeros_like(p)))
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        state[i] = (m, v)
        m_hat, v_hat = m / (1 - b1 ** t), v / (1 - b2 ** t)
        out.append(p * (1 - lr * WD) - lr * m_hat / (v_hat.sqrt() + EPS))
    return out


def clip(gs, max_norm):
    """clip_grad_norm_'s rule: scale every gradient by max_norm / (total norm + 1e-6), at
    most 1."""
    total = math.sqrt(sum(float((g * g).sum()) for g in gs))
    coef = min(1.0, max_norm / (total + 1e-6))
    return [g * coef for g in gs]


def lr_at(step: int) -> float:
    return LR / (step + 1)  # the scheduler below: LambdaLR with f(s) = 1 / (s + 1)


class SquaredNorm:
    """``sum(W^2)`` offering its gradient in closed form, as AdaLoRA's Eq. 4 does on CUDA
    (the engine then adds it after the backward pass instead of through autograd)."""

    closed_form = True

    def __init__(self, w: nn.Parameter):
        self.w, self.added = w, 0

    def __call__(self) -> torch.Tensor:
        raise AssertionError("the closed form was asked for: no autograd regularizer")

    def add_gradients(self, weight) -> torch.Tensor:
        self.added += 1
        with torch.no_grad():
            self.w.grad.add_(2 * self.w * weight)
            return (self.w ** 2).sum()


def make_stepper(grad_accum=1, max_grad_norm=0.0, scaler=None, closed_form=False):
    model = Squared()
    seen: list[tuple[int, bool]] = []
    handle = MethodHandle(
        name="tiny", adapter=[model.lin.weight], head=[model.lin.bias], reg_weight=GAMMA,
        regularizer=(SquaredNorm(model.lin.weight) if closed_form
                     else lambda: (model.lin.weight ** 2).sum()),
        # after_step sees the step number, and the gradients before they are cleared (or
        # that the loss scaler skipped the step, tests/engine/test_skipped_steps.py)
        after_step=lambda t, scored=True, **_: seen.append(
            (t, model.lin.weight.grad is not None) if scored else (t, "skipped"))
        or StepReport(10 - t, {"lin": t}))
    opt = torch.optim.AdamW(handle.trainable, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 / (s + 1))
    scaler = scaler or torch.amp.GradScaler("cpu", enabled=False)
    stepper = Stepper(model, handle, opt, sched, scaler, grad_accum=grad_accum,
                      max_grad_norm=max_grad_norm, closed_form_reg=closed_form)
    return stepper, model, seen


def expected_weights(micro_batches_per_step, grad_accum=1, max_grad_norm=0.0):
    """The layer after one optimizer step per entry of ``micro_batches_per_step``."""
    model = Squared()
    w, b = model.lin.weight.detach().clone(), model.lin.bias.detach().clone()
    state: dict = {}
    for t, micro in enumerate(micro_batches_per_step, start=1):
        gw, gb = torch.zeros_like(w), torch.zeros_like(b)
        for batch in micro:
            # the regularizer goes into every micro-batch's loss, divided like it by accum
            dw, db = grads(w, b, batch, reg=True)
            gw, gb = gw + dw / grad_accum, gb + db / grad_accum
        gs = clip([gw, gb], max_grad_norm) if max_grad_norm > 0 else [gw, gb]
        w, b = adamw([w, b], gs, state, lr_at(t - 1), t)
    return w, b


def run(stepper, micro_batches_per_step):
    out = []
    for t, micro in enumerate(micro_batches_per_step, start=1):
        for batch in micro:
            loss, reg = stepper.backward(batch)
        out.append(stepper.update(t))
    return out, loss, reg


@pytest.mark.parametrize("closed_form", [False, True], ids=["autograd", "closed-form"])
def test_two_adamw_steps_match_the_formula(closed_form):
    stepper, model, seen = make_stepper(closed_form=closed_form)
    steps = [[BATCHES[0]], [BATCHES[1]]]
    (first, second), loss, reg = run(stepper, steps)
    w, b = expected_weights(steps)
    assert torch.allclose(model.lin.weight.detach(), w, atol=1e-6, rtol=0)
    assert torch.allclose(model.lin.bias.detach(), b, atol=1e-6, rtol=0)
    # each step reports the rate it used (then the scheduler moves on) and after_step's log
    assert first == StepLog(pytest.approx(LR), 9, {"lin": 1})
    assert second == StepLog(pytest.approx(LR / 2), 8, {"lin": 2})
    assert seen == [(1, True), (2, True)]
    assert model.lin.weight.grad is None and model.lin.bias.grad is None  # zero_grad(None)
    # backward returns the task loss alone and the unweighted regularizer (of the weights
    # after step 1, which the second micro-batch saw)
    w1, b1 = expected_weights([[BATCHES[0]]])
    want = float(((BATCHES[1]["x"] @ w1.T + b1 - BATCHES[1]["y"]) ** 2).mean())
    assert loss == pytest.approx(want, abs=1e-6)
    assert float(reg.detach()) == pytest.approx(float((w1 ** 2).sum()), abs=1e-6)


@pytest.mark.parametrize("closed_form", [False, True], ids=["autograd", "closed-form"])
def test_gradient_accumulation_averages_the_micro_batches(closed_form):
    stepper, model, seen = make_stepper(grad_accum=2, closed_form=closed_form)
    steps = [[BATCHES[0], BATCHES[1]], [BATCHES[1], BATCHES[0]]]
    run(stepper, steps)
    if closed_form:  # once per micro-batch, weighted like its loss by 1 / grad_accum
        assert stepper.handle.regularizer.added == 4
    w, b = expected_weights(steps, grad_accum=2)
    assert torch.allclose(model.lin.weight.detach(), w, atol=1e-6, rtol=0)
    assert torch.allclose(model.lin.bias.detach(), b, atol=1e-6, rtol=0)
    assert [t for t, _ in seen] == [1, 2]  # one after_step per optimizer step, not per batch


def test_clipping_scales_the_gradient_to_max_grad_norm():
    # A norm far below the gradients' so clipping acts on both steps, and EPS = 1e-3 is not
    # negligible next to the clipped gradients: AdamW's update then depends on their size.
    stepper, model, _ = make_stepper(max_grad_norm=0.01)
    steps = [[BATCHES[0]], [BATCHES[1]]]
    run(stepper, steps)
    w, b = expected_weights(steps, max_grad_norm=0.01)
    assert torch.allclose(model.lin.weight.detach(), w, atol=1e-6, rtol=0)
    assert torch.allclose(model.lin.bias.detach(), b, atol=1e-6, rtol=0)
    unclipped, _ = expected_weights(steps)
    assert not torch.allclose(w, unclipped, atol=1e-4)  # the case really tells them apart


@pytest.mark.parametrize("closed_form", [False, True], ids=["autograd", "closed-form"])
def test_a_loss_scaler_is_unscaled_before_clipping_and_the_step(closed_form):
    # the closed-form gradient is scaled like the loss's, so unscaling treats both alike
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    stepper, model, _ = make_stepper(max_grad_norm=0.01, scaler=scaler,
                                     closed_form=closed_form)
    steps = [[BATCHES[0]], [BATCHES[1]]]
    run(stepper, steps)
    w, b = expected_weights(steps, max_grad_norm=0.01)
    assert torch.allclose(model.lin.weight.detach(), w, atol=1e-6, rtol=0)
    assert torch.allclose(model.lin.bias.detach(), b, atol=1e-6, rtol=0)
