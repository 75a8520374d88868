"""SoRA: the gated layer, the proximal step and the rank decisions on identical gradients.

The reference for the rank decisions is written here from the update docs/maths.md#sora
states (the authors' code: an AdamW step on each gate with bias correction and no weight
decay, then the shrink-and-zero proximal step), in plain per-entry Python arithmetic, and fed
the same gradient sequence as the runner's training step (``Stepper.update``).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from adalora_cli.config import ConfigError, SoRAConfig, TrainConfig
from adalora_cli.engine.precision import Precision
from adalora_cli.engine.step import Stepper
from adalora_cli.methods import apply_method
from adalora_cli.methods.sora import SoRALinear, prox, xi_at
from tests.methods._tiny import FFN, HIDDEN, run_config, tiny_bert


def test_the_proximal_step_by_hand():
    g = torch.tensor([0.35, 0.25, 0.15, 0.05, 0.0, -0.19, -0.2, -0.45])
    # xi = 0.1: shrink by 0.1, and zero what would fall below 0.1 after shrinking (|g| < 0.2)
    expected = torch.tensor([0.25, 0.15, 0.0, 0.0, 0.0, 0.0, -0.1, -0.35])
    torch.testing.assert_close(prox(g, 0.1), expected)
    assert torch.equal(prox(g, 0.0), g)


def test_the_sparsifying_schedule_by_hand():
    cfg = SoRAConfig(xi=1e-3, xi_max=7e-3, xi_steps=7)
    got = [xi_at(t, 70, cfg) for t in (1, 10, 11, 20, 21, 61, 70)]
    assert got == pytest.approx([1e-3, 1e-3, 2e-3, 2e-3, 3e-3, 7e-3, 7e-3])
    assert xi_at(55, 70, SoRAConfig(xi=2e-3)) == 2e-3  # no xi_max: fixed


def test_the_gated_layer_by_hand():
    base = nn.Linear(2, 2)
    with torch.no_grad():
        base.weight.copy_(torch.eye(2))
        base.bias.zero_()
    layer = SoRALinear(base, r_max=2, alpha=4.0)  # s = 4 / 2
    with torch.no_grad():
        layer.A.copy_(torch.tensor([[1.0, 0.0], [1.0, 1.0]]))
        layer.B.copy_(torch.tensor([[1.0, 0.0], [0.0, 3.0]]))
        layer.gate.copy_(torch.tensor([0.5, 0.0]))  # the second rank is pruned
    x = torch.tensor([[1.0, 2.0]])
    # A x = [1, 3]; * g = [0.5, 0]; B (.) = [0.5, 0]; * 2 = [1, 0]; + x
    torch.testing.assert_close(layer(x), torch.tensor([[2.0, 2.0]]))
    torch.testing.assert_close(layer.delta_weight(), torch.tensor([[1.0, 0.0], [0.0, 0.0]]))


def test_what_trains_and_how_it_is_counted():
    model = tiny_bert()
    handle = apply_method(model, run_config("sora", sora={"r_max": 3, "l1": 2.5}), 10)
    assert all(layer.gate.shape == (3,) for _, layer in handle.layers)
    # 12 matrices: 8 of 32x32, the FFN pair 37x32 and 32x37, twice; r (d_in + d_out) + r each
    costs = [HIDDEN + HIDDEN] * 8 + [FFN + HIDDEN] * 4
    assert handle.adapter_params == sum(3 * (c + 1) for c in costs)
    # the gates train in their own group without weight decay, all else at the rate
    groups = handle.optimizer_groups(1e-3, 0.1)
    assert [(len(g["params"]), g["lr"], g["weight_decay"]) for g in groups] == [
        (24 + 2, 1e-3, 0.1), (12, 1e-3, 0.0)]
    # the L1 term: mean |g| over every gate, weighted by l1, logged as gate_l1
    gates = torch.cat([layer.gate.detach() for _, layer in handle.layers])
    torch.testing.assert_close(handle.regularizer(), gates.abs().mean())
    assert (handle.reg_weight, handle.reg_name) == (2.5, "gate_l1")
    with torch.no_grad():
        for i, (_, layer) in enumerate(handle.layers):
            layer.gate[: i % 4] = 0.0  # matrix i keeps 3 - (i % 4 capped) gates
    kept = [3 - min(i % 4, 3) for i in range(12)]
    assert list(handle.allocator.rank_pattern().values()) == kept
    assert handle.allocator.final_adapter_params() == sum(
        k * (c + 1) for k, c in zip(kept, costs))


def _reference_adam_prox(g, grads, lrs, xis, b1=0.9, b2=0.999, eps=1e-8):
    """Per gate entry: AdamW (bias-corrected, no weight decay) then the proximal step,
    in plain Python floats."""
    g, m, v = list(g), [0.0] * len(g), [0.0] * len(g)
    history = []
    for t, (grad, lr, xi) in enumerate(zip(grads, lrs, xis), start=1):
        for i, gi in enumerate(grad):
            m[i] = b1 * m[i] + (1 - b1) * gi
            v[i] = b2 * v[i] + (1 - b2) * gi * gi
            m_hat, v_hat = m[i] / (1 - b1 ** t), v[i] / (1 - b2 ** t)
            z = g[i] - lr * m_hat / (math.sqrt(v_hat) + eps)
            g[i] = z - xi * math.copysign(1.0, z) if abs(z) >= 2 * xi else 0.0
        history.append(list(g))
    return history


def test_rank_decisions_equal_the_reference_on_identical_gradients():
    T, lr, xi = 6, 0.05, 0.02
    model = tiny_bert()
    cfg = run_config("sora", sora={"r_max": 4, "xi": xi, "xi_max": 0.08, "xi_steps": 3})
    handle = apply_method(model, cfg, T)
    layers = [layer for _, layer in handle.layers]
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():  # gates near the threshold, so that the decisions vary
        for layer in layers:
            layer.gate.copy_(torch.randn(4, generator=gen) * 0.15)
    start = [layer.gate.detach().tolist() for layer in layers]
    grads = [[torch.randn(4, generator=gen).tolist() for _ in layers] for _ in range(T)]
    train = TrainConfig(learning_rate=lr, max_grad_norm=0.0)
    stepper = Stepper.build(model, handle, train, steps=T,
                            precision=Precision.of(train.precision, torch.device("cpu")))
    got, reports = [], []
    for t in range(1, T + 1):
        for layer, grad in zip(layers, grads[t - 1]):
            layer.gate.grad = torch.tensor(grad)
        reports.append(stepper.update(t))
        got.append([layer.gate.detach().tolist() for layer in layers])
    lrs = [lr * (T - s) / T for s in range(T)]  # linear decay, no warm-up
    xis = [xi_at(t, T, cfg.sora) for t in range(1, T + 1)]
    assert xis == pytest.approx([0.02, 0.02, 0.05, 0.05, 0.08, 0.08])
    for k in range(len(layers)):
        ref = _reference_adam_prox(start[k], [grads[s][k] for s in range(T)], lrs, xis)
        for t in range(T):
            assert [x == 0 for x in got[t][k]] == [x == 0 for x in ref[t]], (k, t)
            assert got[t][k] == pytest.approx(ref[t], abs=1e-6), (k, t)
    # the logged budget is the number of nonzero gates; ranks are logged when they change
    final = sum(x != 0 for row in got[-1] for x in row)
    assert reports[-1].budget == final and final < 4 * len(layers)
    assert any(r.ranks is not None for r in reports)


def test_bad_sora_settings_are_one_line_errors():
    with pytest.raises(ConfigError, match=r"sora.xi_max must be >= sora.xi \(0.001\)"):
        run_config("sora", sora={"xi": 1e-3, "xi_max": 1e-4})
    with pytest.raises(ConfigError, match="sora.r_max must be >= 1, got 0"):
        run_config("sora", sora={"r_max": 0})
    with pytest.raises(ConfigError, match="sora.xi and sora.l1 must be >= 0"):
        run_config("sora", sora={"l1": -1})


def test_a_step_the_fp16_loss_scaler_skips_moves_no_gate():
    """Under fp16 loss scaling a step with an infinite gradient is skipped whole: no AdamW
    step and no proximal step on the gates; the rest equals the reference without it (its
    lr and xi schedules still count the skipped step)."""
    T, lr, xi, skip = 6, 0.05, 0.02, 3
    model = tiny_bert()
    cfg = run_config("sora", sora={"r_max": 4, "xi": xi, "xi_max": 0.08, "xi_steps": 3})
    handle = apply_method(model, cfg, T)
    layers = [layer for _, layer in handle.layers]
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for layer in layers:
            layer.gate.copy_(torch.randn(4, generator=gen) * 0.15)
    start = [layer.gate.detach().tolist() for layer in layers]
    grads = [[torch.randn(4, generator=gen).tolist() for _ in layers] for _ in range(T)]
    train = TrainConfig(learning_rate=lr, max_grad_norm=0.0)
    stepper = Stepper.build(model, handle, train, steps=T,
                            precision=Precision.of(train.precision, torch.device("cpu")))
    stepper.scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    stepper.scaler.scale(torch.ones(()))  # the scaler makes its scale on first use
    got, reports = [], []
    for t in range(1, T + 1):
        for layer, grad in zip(layers, grads[t - 1]):
            # the scaled loss's gradient (the scale halves after the skipped step)
            layer.gate.grad = torch.tensor(grad) * stepper.scaler.get_scale()
        if t == skip:  # an fp16 overflow in one gate's gradient
            layers[0].gate.grad[1] = math.inf
        reports.append(stepper.update(t))
        got.append([layer.gate.detach().tolist() for layer in layers])
    assert [r.skipped for r in reports] == [t == skip for t in range(1, T + 1)]
    assert got[skip - 1] == got[skip - 2]  # bit for bit: nothing moved at the skipped step
    assert reports[skip - 1].ranks is None
    assert reports[skip - 1].budget == sum(x != 0 for row in got[skip - 2] for x in row)
    kept = [s for s in range(T) if s != skip - 1]
    lrs = [lr * (T - s) / T for s in kept]
    xis = [xi_at(s + 1, T, cfg.sora) for s in kept]
    for k in range(len(layers)):
        ref = _reference_adam_prox(start[k], [grads[s][k] for s in kept], lrs, xis)
        for t, row in enumerate(got[:skip - 1] + got[skip:]):
            assert [x == 0 for x in row[k]] == [x == 0 for x in ref[t]], (k, t)
            assert row[k] == pytest.approx(ref[t], abs=1e-6), (k, t)
