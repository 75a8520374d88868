"""fp16 loss scaling, tested on the CPU with a CPU GradScaler and injected infinities: a step
with a non-finite gradient or loss is skipped as the GradScaler skips it (no optimizer
update, the scale backed off), feeds nothing into AdaLoRA's importance averages, still
counts in ``t``; only ``MAX_SKIPPED`` in a row end the run."""

from __future__ import annotations

import math

import pytest
import torch

from adalora_cli.config import TrainConfig
from adalora_cli.engine.precision import Precision
from adalora_cli.engine.step import MAX_SKIPPED, Stepper
from adalora_cli.methods import apply_method
from tests.methods._tiny import run_config, tiny_batch, tiny_bert

from .test_stepper import BATCHES, adamw, grads, lr_at, make_stepper

SCALE = 1024.0


def scaled_stepper():
    return make_stepper(scaler=torch.amp.GradScaler("cpu", init_scale=SCALE))


def backward(stepper, batch, poison: bool = False) -> float:
    loss, _ = stepper.backward(batch)
    if poison:  # an fp16 overflow in the backward pass, as the scaler would see it
        stepper.model.lin.weight.grad[1, 2] = math.inf
    return loss


def test_a_non_finite_gradient_skips_the_step_and_the_schedule_moves_on():
    stepper, model, seen = scaled_stepper()
    logs = []
    for t, (batch, poison) in enumerate([(BATCHES[0], False), (BATCHES[1], True),
                                         (BATCHES[1], False)], start=1):
        before = (model.lin.weight.detach().clone(), model.lin.bias.detach().clone())
        loss = backward(stepper, batch, poison)
        logs.append(stepper.update(t, loss))
        if poison:  # no update at all: the weights are bit for bit those of step 1
            assert torch.equal(model.lin.weight, before[0])
            assert torch.equal(model.lin.bias, before[1])
            assert stepper.scaler.get_scale() == SCALE / 2  # backed off, as GradScaler does
    assert [log.skipped for log in logs] == [False, True, False]
    # t counts the skipped step: the lr schedule moved on (step 3 uses lr_at(2)), and the
    # method's hook heard of it, told not to score its gradients
    assert [log.lr for log in logs] == pytest.approx([lr_at(0), lr_at(1), lr_at(2)])
    assert seen == [(1, True), (2, "skipped"), (3, True)]
    # AdamW by hand: two updates (its own step count 1 and 2), the second at step 3's lr
    w, b = model.lin.weight.detach(), model.lin.bias.detach()
    w0, b0 = make_stepper()[1].lin.weight.detach(), make_stepper()[1].lin.bias.detach()
    state: dict = {}
    w1, b1 = adamw([w0, b0], grads(w0, b0, BATCHES[0], reg=True), state, lr_at(0), 1)
    w2, b2 = adamw([w1, b1], grads(w1, b1, BATCHES[1], reg=True), state, lr_at(2), 2)
    assert torch.allclose(w, w2, atol=1e-6, rtol=0) and torch.allclose(b, b2, atol=1e-6, rtol=0)
    assert (stepper.skipped, stepper.skip_run) == (1, 0)


def test_a_non_finite_loss_with_finite_gradients_is_skipped_too():
    stepper, model, _ = scaled_stepper()
    before = model.lin.weight.detach().clone()
    stepper.backward(BATCHES[0])  # finite gradients
    log = stepper.update(1, math.nan)
    assert log.skipped and torch.equal(model.lin.weight, before)
    assert stepper.scaler.get_scale() == SCALE / 2
    assert model.lin.weight.grad is None  # cleared for the next step


def test_without_loss_scaling_nothing_is_skipped():
    """fp32/bf16: an infinite gradient under a finite loss is not the scaler's business; the
    step runs (and a non-finite loss stops the run: tests/engine/test_loop.py)."""
    stepper, model, _ = make_stepper()
    loss = backward(stepper, BATCHES[0], poison=True)
    assert not stepper.update(1, loss).skipped
    assert not torch.isfinite(model.lin.weight).all()


def test_only_max_skipped_steps_in_a_row_end_the_run(monkeypatch):
    stepper, model, _ = scaled_stepper()
    for t in range(1, MAX_SKIPPED):  # one short of the limit: the run goes on
        assert stepper.update(t, backward(stepper, BATCHES[0], poison=True)).skipped
    assert stepper.scaler.get_scale() == SCALE / 2 ** (MAX_SKIPPED - 1)
    assert not stepper.update(MAX_SKIPPED, backward(stepper, BATCHES[1])).skipped
    assert (stepper.skipped, stepper.skip_run) == (MAX_SKIPPED - 1, 0)  # the run restarts
    first = MAX_SKIPPED + 1
    for t in range(first, first + MAX_SKIPPED - 1):
        stepper.update(t, backward(stepper, BATCHES[0], poison=True))
    last = first + MAX_SKIPPED - 1
    with pytest.raises(FloatingPointError) as err:
        stepper.update(last, math.nan)
    scale = SCALE / 2 ** (2 * MAX_SKIPPED - 1)  # one back-off per skip, growth never reached
    assert str(err.value) == (
        f"the fp16 loss scaler skipped {MAX_SKIPPED} steps in a row (steps {first}-{last}, "
        f"last loss nan), each with a non-finite loss or gradient, and the loss scale fell to "
        f"{scale:g}; likely causes: fp16 autocast overflowed (set train.precision=bf16 or "
        "fp32); train.learning_rate=0.1 is too high (lower it)")


# ------------------------------------------------------------------ AdaLoRA's allocator
T, T_INIT, T_FINAL, DELTA_T, BUDGET = 30, 5, 10, 3, 10


def adalora_stepper() -> Stepper:
    cfg = run_config("adalora", adalora={"budget": BUDGET, "t_init": T_INIT,
                                         "t_final": T_FINAL, "delta_t": DELTA_T})
    model = tiny_bert(0)
    handle = apply_method(model, cfg, T)
    train = TrainConfig(learning_rate=0.01, warmup_steps=4, max_grad_norm=0.5)
    stepper = Stepper.build(model, handle, train, T, Precision.of("auto", torch.device("cpu")))
    stepper.scaler = torch.amp.GradScaler("cpu", init_scale=SCALE)
    return stepper


def averages(allocator) -> list[torch.Tensor]:
    return [getattr(allocator, name).clone() for name in ("I", "I_bar", "U_bar", "mask")]


def test_a_skipped_step_feeds_nothing_into_the_importance_averages():
    stepper = adalora_stepper()
    allocator = stepper.handle.allocator
    for t in range(1, 9):
        stepper.backward(tiny_batch(t))
        assert not stepper.update(t).skipped
    before = averages(allocator)
    weights = [p.detach().clone() for p in stepper.handle.trainable]
    scores = allocator.scores()
    # b(9) = bT + floor((b0 - bT) (T - t_f - t)^3 / (T - t_i - t_f)^3) with b0 = 48:
    # 10 + floor(38 * 11^3 / 15^3) = 10 + 14
    b9 = 24
    # step 9 is a mask event (t > t_init, 9 % delta_t == 0) and its gradients overflow
    loss, _ = stepper.backward(tiny_batch(9))
    stepper.handle.trainable[0].grad.view(-1)[0] = math.nan
    log = stepper.update(9, loss)
    assert log.skipped and log.budget == b9
    after = averages(allocator)
    for name, a, b in zip(("I", "I_bar", "U_bar"), before, after):
        assert torch.equal(a, b), name  # bit for bit: nothing from the skipped step
    # the mask event still happened on schedule, from the averages of steps 1-8: the top
    # b(9) triplets of the scores as they stood (a stable sort, as the allocator breaks ties)
    keep = torch.zeros_like(allocator.mask)
    keep[torch.argsort(scores, descending=True, stable=True)[:b9]] = 1.0
    assert torch.equal(allocator.mask, keep) and sum(log.ranks.values()) == b9
    # no optimizer update: every weight as before, but for the pruned singular values
    lams = {id(t): (off, r) for t, how, off, r in allocator._targets if how == "lam"}
    for p, old in zip(stepper.handle.trainable, weights):
        if id(p) in lams:
            off, r = lams[id(p)]
            old = old * keep[off:off + r]
        assert torch.equal(p.detach(), old)
    # and the next finite step scores again
    stepper.backward(tiny_batch(10))
    assert not stepper.update(10).skipped
    assert not torch.equal(allocator.I_bar, before[1])


def test_the_loss_scaler_is_on_exactly_for_fp16():
    """Stepper.build enables a GradScaler (of the run's device type) for fp16 only, as the
    build's record says; on the CPU autocast never asks for fp16, so the record is made as
    a V100's would be."""
    model = tiny_bert(0)
    handle = apply_method(model, run_config("lora"), T)
    cpu = torch.device("cpu")
    plain = Stepper.build(model, handle, TrainConfig(), T, Precision.of("fp32", cpu))
    assert not plain.scaler.is_enabled() and plain.precision == "fp32"
    half = Stepper.build(model, handle, TrainConfig(), T, Precision.of("bf16", cpu))
    assert not half.scaler.is_enabled() and half.precision == "bf16"
    # the step reads the record, not train.precision: fp32 there changes nothing
    scaled = Stepper.build(model, handle, TrainConfig(precision="fp32"), T,
                           Precision("auto", cpu, "fp16"))
    assert scaled.scaler.is_enabled() and scaled.precision == "fp16"


# ------------------------------------------------------------------ IncreLoRA's growth


def increlora_run(scaler: torch.amp.GradScaler | None) -> tuple[Stepper, list, list]:
    """T steps of IncreLoRA on the tiny BERT; returns the stepper, the importance averages
    after every step and the rank pattern after every step."""
    cfg = run_config("increlora", adalora={"t_init": 4, "delta_t": 2, "t_final": 8},
                     increlora={"budget": 23, "top_h": 3, "add_rank": 2})
    model = tiny_bert(0)
    handle = apply_method(model, cfg, T)
    stepper = Stepper.build(model, handle, TrainConfig(learning_rate=0.01), T,
                            Precision.of("auto", torch.device("cpu")))
    if scaler is not None:
        stepper.scaler = scaler
    grower, averages, ranks = handle.allocator, [], []
    for t in range(1, T + 1):
        stepper.backward(tiny_batch(t))
        assert not stepper.update(t).skipped
        averages.append((grower.I_bar.clone(), grower.U_bar.clone()))
        ranks.append(list(grower.rank_pattern().values()))
    return stepper, averages, ranks


def test_increlora_scores_true_gradients_under_a_moving_loss_scale():
    """IncreLoRA's hook collects dL/dDelta W of the *scaled* loss (it is no parameter, so
    the scaler's unscale_ never sees it). With a scale that doubles every other step, the
    importance averages and the growth must equal an unscaled run's: powers of two scale
    fp32 exactly, so the weights, and so everything, match."""
    _, plain_avg, plain_ranks = increlora_run(None)
    scaler = torch.amp.GradScaler("cpu", init_scale=SCALE, growth_interval=2)
    scaled, scaled_avg, scaled_ranks = increlora_run(scaler)
    assert scaled.scaler.get_scale() == SCALE * 2 ** (T // 2)  # it did move, 15 times
    assert plain_ranks[-1] != plain_ranks[0] and sum(plain_ranks[-1]) == 23  # it grew
    assert scaled_ranks == plain_ranks
    for (i_plain, u_plain), (i_scaled, u_scaled) in zip(plain_avg, scaled_avg):
        assert torch.allclose(i_scaled, i_plain, rtol=1e-6, atol=0)
        assert torch.allclose(u_scaled, u_plain, rtol=1e-6, atol=0)
    assert plain_avg[T - 9][0].abs().max() > 0  # the last scored step scored something
