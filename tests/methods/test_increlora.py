"""IncreLoRA: the growth plan, the layer, the score's gradient, and the rank decisions on
identical gradients against a reference written here from the equations of
docs/maths.md#increlora (per-matrix sensitivity of the whole update, AdaLoRA's smoothing and
uncertainty per matrix, the top_h matrices gaining add_rank ranks at each growth event until
the budget is reached)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from adalora_cli.config import ConfigError
from adalora_cli.methods import apply_method
from adalora_cli.methods.growth import events_between, plan_growth
from adalora_cli.methods.increlora import RESERVE_LAM, IncreLoRALinear, born_orthogonality
from tests.methods._tiny import FFN, HIDDEN, run_config, tiny_batch, tiny_bert

SCHEDULE = {"t_init": 4, "delta_t": 2, "t_final": 8}  # the smoke config's phases


def _cfg(**increlora):
    return run_config("increlora", adalora=SCHEDULE, increlora=increlora)


# --------------------------------------------------------------------------- the plan


def test_the_growth_plan_by_hand():
    assert events_between(4, 8, 2, 32) == 10  # t = 6, 8, ..., 24
    assert events_between(0, 0, 5, 23) == 4  # t = 5, 10, 15, 20
    plan = plan_growth(_cfg(budget=16), n=12, total_steps=32)
    # 12 -> 16 ranks; add_rank = 16 / 24 rounded half up = 1; ceil(4 / 10) = 1 matrix per
    # event; 4 rounds; room: 1 + 1 * (4 rounds + 1 reserve)
    assert (plan.add_rank, plan.top_h, plan.rounds, plan.capacity) == (1, 1, 4, 6)
    assert [t for t in range(1, 33) if plan.is_event(t)] == list(range(6, 25, 2))
    plan = plan_growth(_cfg(budget=144, top_h=5), n=72, total_steps=3900)  # rte at rbar 2
    assert (plan.add_rank, plan.top_h, plan.rounds, plan.capacity) == (1, 5, 15, 17)
    plan = plan_growth(_cfg(budget=576), n=72, total_steps=3900)  # rbar 8: 4 ranks a time
    assert plan.add_rank == 4
    own = plan_growth(_cfg(budget=16, t_init=0, delta_t=5, t_final=0, reserve=False), 12, 32)
    assert (own.t_init, own.delta_t, own.top_h, own.capacity) == (0, 5, 1, 5)  # 6 events


@pytest.mark.parametrize("section, total, message", [
    ({"budget": 8}, 32, "increlora.budget=8 is below the starting total rank 12"),
    ({"budget": 16, "top_h": 1, "add_rank": 1, "t_init": 20}, 32,
     r"needs 4 growth events .* but has 2 growth events"),
    ({"budget": 400, "add_rank": 1}, 32,
     "cannot grow 388 ranks in 10 growth events .* even choosing all 12 matrices"),
    ({"budget": 16, "t_init": 24}, 32, "IncreLoRA has no growth event"),
])
def test_a_plan_that_cannot_reach_the_budget_is_refused(section, total, message):
    with pytest.raises(ConfigError, match=message):
        plan_growth(_cfg(**section), n=12, total_steps=total)


def test_room_beyond_the_smallest_dimension_is_refused():
    with pytest.raises(ConfigError, match="room for 42 ranks .* smallest adapted dimension "
                                          r"\(32\); raise increlora.top_h"):
        apply_method(tiny_bert(), _cfg(budget=52, top_h=1, add_rank=1, delta_t=1,
                                       t_final=0, t_init=0), 60)


# --------------------------------------------------------------------------- the layer


def _layer(capacity=4, init_rank=1, reserve=1, alpha=6.0):
    base = nn.Linear(3, 2)
    torch.manual_seed(0)
    return IncreLoRALinear(base, capacity, init_rank, reserve, alpha), base


def test_the_layer_scales_by_its_current_rank_and_ignores_unborn_triplets():
    layer, base = _layer()
    assert layer.counts() == (1, 2)
    with torch.no_grad():
        layer.lam[0] = 0.7
        layer.P[:, 3] = 5.0  # unborn: must change nothing
    x = torch.randn(5, 3)
    P, lam, Q = layer.P.detach(), layer.lam.detach(), layer.Q.detach()
    # rank 1: scale 6 / 1; the reserve (slot 1, lam 1e-5) is in, slots 2-3 are not born
    assert lam[1] == pytest.approx(RESERVE_LAM) and lam[2] == lam[3] == 0
    dw = 6.0 * (P[:, :2] @ torch.diag(lam[:2]) @ Q[:2])
    torch.testing.assert_close(layer(x), base(x) + x @ dw.T)
    torch.testing.assert_close(layer.delta_weight(), dw)
    gen = torch.Generator().manual_seed(1)
    layer.grow(1, reserve=True, generator=gen)  # the reserve becomes rank 2, a new one waits
    assert layer.counts() == (2, 3)
    assert layer.lam[1].item() == pytest.approx(RESERVE_LAM)  # trained on from 1e-5
    assert layer.lam[2].item() == pytest.approx(RESERVE_LAM)  # the new reserve
    assert layer.P[:, 2].abs().sum() > 0 and layer.Q[2].abs().sum() > 0
    assert layer.scaling().item() == pytest.approx(3.0)  # 6 / 2


def test_only_ordinary_lam_and_born_factors_get_gradients():
    layer, _ = _layer(capacity=4, init_rank=1, reserve=1)
    with torch.no_grad():
        layer.lam[0] = 0.5
    layer(torch.randn(6, 3)).pow(2).sum().backward()
    assert layer.lam.grad[0] != 0 and torch.all(layer.lam.grad[1:] == 0)  # reserve: none
    assert layer.P.grad[:, :2].abs().sum() > 0  # the reserve's P trains (advance learning)
    assert torch.all(layer.P.grad[:, 2:] == 0) and torch.all(layer.Q.grad[2:] == 0)


def test_scoring_collects_the_gradient_of_the_whole_update():
    layer, base = _layer()
    with torch.no_grad():
        layer.lam[0] = 0.5
    x, w = torch.randn(2, 5, 3), torch.randn(2, 5, 2)
    plain = layer(x)
    layer.scoring = True
    out = layer(x)
    torch.testing.assert_close(out, plain)  # the same function, Delta W formed explicitly
    for _ in range(2):  # two micro-batches: their gradients add up
        (layer(x) * w).sum().backward()
    grad = 2 * torch.einsum("bto,bti->oi", w, x)  # dL/dDelta W = sum_t w_t x_t^T
    dw = layer.delta_weight().detach()
    expected = (dw * grad).abs().sum() / math.sqrt(6)
    assert layer.take_sensitivity().item() == pytest.approx(expected.item(), rel=1e-5)
    assert layer.take_sensitivity().item() == 0.0  # cleared for the next step


def test_the_regularizer_sees_born_triplets_only():
    layer, _ = _layer(capacity=5, init_rank=2, reserve=1)
    P, Q = layer.P.detach()[:, :3], layer.Q.detach()[:3]
    eye = torch.eye(3)
    expected = (torch.linalg.matrix_norm(P.T @ P - eye)
                + torch.linalg.matrix_norm(Q @ Q.T - eye)) / 2
    torch.testing.assert_close(born_orthogonality([layer]), expected)


# --------------------------------------------------------------------------- the decisions


def _reference(inputs, n, plan, beta1=0.85, beta2=0.85, skipped=()):
    """Ranks after every step from the equations alone: inputs[t][k] = (Delta W, grad);
    a step in ``skipped`` (by the fp16 loss scaler) updates no average."""
    rank = [plan.init_rank] * n
    i_bar, u_bar = [0.0] * n, [0.0] * n
    history = []
    for t, step in enumerate(inputs, start=1):
        if sum(rank) < plan.budget:
            for k, (dw, g) in enumerate(step):
                if t in skipped:
                    break
                s = float((dw * g).abs().sum()) / math.sqrt(dw.numel())
                i_bar[k] = beta1 * i_bar[k] + (1 - beta1) * s
                u_bar[k] = beta2 * u_bar[k] + (1 - beta2) * abs(s - i_bar[k])
            if plan.t_init < t <= plan.total_steps - plan.t_final and t % plan.delta_t == 0:
                score = [i_bar[k] * u_bar[k] for k in range(n)]
                order = sorted(range(n), key=lambda k: (-score[k], k))
                left = plan.budget - sum(rank)
                for k in order[:plan.top_h]:
                    give = min(plan.add_rank, left)
                    rank[k] += give
                    left -= give
        history.append(list(rank))
    return history


def test_a_step_the_fp16_loss_scaler_skips_updates_no_average():
    """Skipped steps (infinite gradients collected) enter no average and leave nothing
    collected behind; a growth event at a skipped step still grows from the averages so far."""
    T, skipped = 32, {5, 6, 10, 11}  # 6 and 10 are growth events (t_init 4, delta_t 2)
    model = tiny_bert()
    handle = apply_method(model, _cfg(budget=23, top_h=3, add_rank=2), T)
    grower, layers = handle.allocator, [layer for _, layer in handle.layers]
    gen = torch.Generator().manual_seed(5)
    inputs, got = [], []
    for t in range(1, T + 1):
        step = []
        for k, layer in enumerate(layers):
            shape = (layer.out_features, layer.in_features)
            dw = torch.randn(shape, generator=gen) * (1 + 3 * (k % 4 == t % 4))
            g = torch.randn(shape, generator=gen)
            step.append((dw, g))
            if not layer.scoring:  # growth is over: the forward collects nothing
                continue
            layer._dw, layer._grad = dw, g.clone()
            if t in skipped:  # what an fp16 overflow leaves in the collected gradient
                layer._grad[0, 0] = math.inf
        inputs.append(step)
        grower.step(t, scored=t not in skipped)
        assert all(layer._dw is None and layer._grad is None for layer in layers)
        assert torch.isfinite(grower.I_bar).all() and torch.isfinite(grower.U_bar).all()
        got.append(list(grower.rank_pattern().values()))
    assert got == _reference(inputs, len(layers), grower.plan, skipped=skipped)
    assert got[5] != got[4]  # step 6, skipped, still grew
    assert got != _reference(inputs, len(layers), grower.plan)  # the skips mattered


@pytest.mark.parametrize("section", [
    {"budget": 17},  # auto top_h = 1, one rank a time
    {"budget": 23, "top_h": 3, "add_rank": 2},  # the last event gives one matrix 1 rank
    {"budget": 20, "top_h": 4, "reserve": False},
])
def test_rank_decisions_equal_the_reference_on_identical_gradients(section):
    T = 32
    model = tiny_bert()
    handle = apply_method(model, _cfg(**section), T)
    grower, layers = handle.allocator, [layer for _, layer in handle.layers]
    plan = grower.plan
    gen = torch.Generator().manual_seed(3)
    inputs, got, budgets = [], [], []
    for t in range(1, T + 1):
        step = []
        for k, layer in enumerate(layers):
            shape = (layer.out_features, layer.in_features)
            # some matrices much more important than the rest, with noise
            dw = torch.randn(shape, generator=gen) * (1 + 3 * (k % 3 == 0))
            g = torch.randn(shape, generator=gen)
            layer._dw, layer._grad = dw, g.clone()
            step.append((dw, g))
        inputs.append(step)
        report = grower.step(t)
        got.append(list(grower.rank_pattern().values()))
        budgets.append(report.budget)
    expected = _reference(inputs, len(layers), plan)
    assert got == expected
    assert got[-1] != got[0] and sum(got[-1]) == section["budget"]  # exactly b(T)
    assert budgets == [sum(r) for r in got]
    assert not any(layer.scoring for layer in layers)  # growth over: plain forward again
    for layer in layers:  # the reserves left over are switched off
        rank, born = layer.counts()
        assert torch.all(layer.lam[rank:born] == 0)


def test_counts_by_hand_and_the_frozen_masks_travel_with_the_weights():
    model = tiny_bert()
    handle = apply_method(model, _cfg(budget=16), 32)
    costs = [HIDDEN + HIDDEN + 1] * 8 + [FFN + HIDDEN + 1] * 4
    assert handle.adapter_params == sum(2 * c for c in costs)  # 1 rank + 1 reserve each
    assert handle.allocator.final_adapter_params() == sum(costs)
    assert len(handle.kept) == 24 and not any(p.requires_grad for p in handle.kept)
    assert handle.reg_name == "orth_reg" and handle.reg_weight == 0.1
    loss = model(**tiny_batch()).loss + handle.reg_weight * handle.regularizer()
    loss.backward()  # every ordinary and reserve factor gets a gradient
    assert all(layer.P.grad[:, :2].abs().sum() > 0 for _, layer in handle.layers)


def test_a_run_counts_what_trains_as_its_dry_run_does(smoke_runs, in_repo):
    """The smoke run grows 12 -> 16 ranks over 4 growth events, so every matrix holds room
    for 6 triplets; what trains is its starting rank 1 plus 1 reserve, and the head."""
    from safetensors.torch import load_file

    from adalora_cli.cli.train import end_of_run
    from adalora_cli.config import load_config
    from adalora_cli.engine.dryrun import dry_run
    from adalora_cli.rundir.summary import read_summary

    run = smoke_runs("configs/smoke/glue.yaml", "method.name=increlora", "train.max_steps=12",
                     "train.eval_every=null", "adalora.t_init=1", "adalora.t_final=2",
                     "adalora.delta_t=1")  # the run tests/artifacts/test_export_baselines.py trains
    summary = read_summary(run)
    adapter = 2 * (8 * (HIDDEN + HIDDEN + 1) + 4 * (FFN + HIDDEN + 1))  # 8 attention + 4 FFN
    head = HIDDEN * 2 + 2  # the classifier of tiny-bert's 2 labels
    assert (summary.adapter_params, summary.head_params) == (adapter, head)
    assert summary.trainable_params == adapter + head == 1666
    assert summary.final_budget == 16
    P = load_file(str(run / "adapter_model.safetensors"))["bert.encoder.layer.0.output.dense.P"]
    assert P.shape == (HIDDEN, 6)  # the room: 1 + 1 x (4 events + 1 reserve)
    cfg = load_config(run / "config.yaml")
    assert dry_run(cfg).trainable_params == summary.trainable_params
    assert f"trained {adapter + head:,} parameters ({adapter:,} adapter + {head:,} head)" in (
        end_of_run(summary))
