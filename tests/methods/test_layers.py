"""SVDLinear, LoRALinear and the orthogonal regularizer against hand-computed values."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from adalora_cli.methods.adalora import (
    OrthogonalRegularizer,
    SVDLinear,
    orthogonal_regularizer,
    orthogonal_regularizer_grads,
)
from adalora_cli.methods.adapters import HoulsbyAdapter
from adalora_cli.methods.lora import LoRALinear


def _linear(weight: list[list[float]], bias: list[float]) -> nn.Linear:
    w = torch.tensor(weight)
    lin = nn.Linear(w.shape[1], w.shape[0])
    with torch.no_grad():
        lin.weight.copy_(w)
        lin.bias.copy_(torch.tensor(bias))
    return lin


def _set(param: nn.Parameter, values: list) -> None:
    with torch.no_grad():
        param.copy_(torch.tensor(values, dtype=param.dtype))


def test_svd_linear_matches_hand_computation() -> None:
    layer = SVDLinear(_linear([[1.0, 0.0], [0.0, 1.0]], [0.5, -0.5]), r0=2, alpha=4.0)
    _set(layer.P, [[1.0, 0.0], [0.0, 2.0]])
    _set(layer.lam, [3.0, 0.0])
    _set(layer.Q, [[1.0, 1.0], [0.0, 1.0]])
    x = torch.tensor([[1.0, 2.0]])
    # W0 x + b = [1.5, 1.5]; Q x = [3, 2]; lam * Qx = [9, 0]; P (.) = [9, 0]; * 4/2 = [18, 0]
    assert torch.equal(layer(x), torch.tensor([[19.5, 1.5]]))


def test_svd_linear_matches_explicit_matrices_and_keeps_r0_scaling() -> None:
    torch.manual_seed(0)
    base = nn.Linear(5, 3)
    layer = SVDLinear(base, r0=4, alpha=8.0)
    x = torch.randn(7, 5)
    assert torch.equal(layer(x), base(x))  # lam = 0: Delta W = 0 at init
    assert torch.count_nonzero(layer.delta_weight()) == 0
    _set(layer.lam, [0.5, -1.0, 0.0, 0.0])  # two singular values pruned
    P, Q, lam = layer.P.detach(), layer.Q.detach(), layer.lam.detach()
    # The scale stays alpha / r0 = 8 / 4 even though only 2 singular values remain.
    expected = x @ base.weight.T + base.bias + (8.0 / 4) * (P @ torch.diag(lam) @ Q @ x.T).T
    torch.testing.assert_close(layer(x), expected)


def test_svd_linear_init_and_placement() -> None:
    torch.manual_seed(0)
    layer = SVDLinear(nn.Linear(512, 384), r0=8, alpha=16.0)
    assert layer.P.shape == (384, 8) and layer.lam.shape == (8,) and layer.Q.shape == (8, 512)
    assert torch.count_nonzero(layer.lam) == 0
    for factor in (layer.P, layer.Q):
        assert abs(factor.std().item() - 0.02) < 0.002 and abs(factor.mean().item()) < 0.002
    # trained parameters are fp32 beside a half-precision base (AdamW's eps is 0 in fp16)
    for half in (SVDLinear(nn.Linear(4, 3).to(torch.bfloat16), r0=2, alpha=1.0),
                 LoRALinear(nn.Linear(4, 3).to(torch.float16), r=2, alpha=1.0),
                 HoulsbyAdapter(nn.Linear(4, 3).to(torch.float16), dim=2)):
        assert {p.dtype for p in half.adapter_parameters()} == {torch.float32}


def test_lora_linear_matches_explicit_matrices_and_init() -> None:
    torch.manual_seed(0)
    base = nn.Linear(400, 6)
    layer = LoRALinear(base, r=8, alpha=16.0)
    x = torch.randn(3, 400)
    assert torch.count_nonzero(layer.B) == 0 and torch.equal(layer(x), base(x))
    bound = 1 / math.sqrt(400)  # Kaiming-uniform with a = sqrt(5): U(-1/sqrt(fan_in), +)
    assert layer.A.abs().max() <= bound and layer.A.abs().max() > 0.95 * bound
    with torch.no_grad():
        layer.B.normal_()
    expected = x @ base.weight.T + base.bias + (16.0 / 8) * x @ (layer.B @ layer.A).T
    torch.testing.assert_close(layer(x), expected)


def _svd_with(P: list, Q: list) -> SVDLinear:
    P_t, Q_t = torch.tensor(P), torch.tensor(Q)
    layer = SVDLinear(nn.Linear(Q_t.shape[1], P_t.shape[0]), r0=P_t.shape[1], alpha=1.0)
    _set(layer.P, P)
    _set(layer.Q, Q)
    return layer


def _lora_with(B: list, A: list) -> LoRALinear:
    B_t, A_t = torch.tensor(B), torch.tensor(A)
    layer = LoRALinear(nn.Linear(A_t.shape[1], B_t.shape[0]), r=B_t.shape[1], alpha=1.0)
    _set(layer.B, B)
    _set(layer.A, A)
    return layer


# Layer 1: P has orthonormal columns (norm 0); Q Q^T = diag(4, 1), minus I = diag(3, 0): norm 3.
# Layer 2: P^T P - I = [[0, 1], [1, 0]]: norm sqrt 2; Q = 0 gives -I: norm sqrt 2.
_P1, _Q1 = [[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]], [[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]]
_P2, _Q2 = [[1.0, 1.0], [0.0, 0.0], [0.0, 0.0]], [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]


@pytest.mark.parametrize("make", [_svd_with, _lora_with], ids=["svd", "lora"])
def test_orthogonal_regularizer_both_forms(make) -> None:
    layers = [make(_P1, _Q1), make(_P2, _Q2)]
    code = orthogonal_regularizer(layers, "code")
    # mean of the unsquared norms over the 4 factors [P1, Q1, P2, Q2]
    torch.testing.assert_close(code, torch.tensor((0 + 3 + 2 * math.sqrt(2)) / 4))
    # sum of the squared norms: 0 + 9 + 2 + 2
    torch.testing.assert_close(orthogonal_regularizer(layers, "paper"), torch.tensor(13.0))
    code.backward()  # differentiable with respect to the factors
    assert layers[0].factors()[1].grad is not None
    with pytest.raises(ValueError, match="squared"):
        orthogonal_regularizer(layers, "squared")


@pytest.mark.parametrize("make", [_svd_with, _lora_with], ids=["svd", "lora"])
def test_the_regularizers_closed_form_gradient_by_hand(make) -> None:
    """d||M^T M - I||_F / dM = 2 M E / ||E||_F, E = M^T M - I, worked out for the factors
    above (a right factor's tall form is its transpose; N = 4 factors):
    P1: E = 0, gradient 0 (no 0 / 0). Q1^T = [[2, 0], [0, 1], [0, 0]], E = diag(3, 0),
    M E = [[6, 0], [0, 0], [0, 0]]. P2: E = [[0, 1], [1, 0]], M E = [[1, 1], [0, 0], [0, 0]],
    norm sqrt 2. Q2 = 0: gradient 0."""
    layers = [make(_P1, _Q1), make(_P2, _Q2)]
    zero_p, zero_q = torch.zeros(3, 2), torch.zeros(2, 3)
    q1 = torch.tensor([[6.0, 0.0, 0.0], [0.0, 0.0, 0.0]])  # (M E)^T for Q1
    p2 = torch.tensor([[1.0, 1.0], [0.0, 0.0], [0.0, 0.0]])
    # code: mean of f over 4 factors -> 2 M E / (4 f); Q1: f = 3, P2: f = sqrt 2
    value, factors, grads = orthogonal_regularizer_grads(layers, "code")
    assert float(value) == float(orthogonal_regularizer(layers, "code").detach())  # bit for bit
    for got, want in zip(grads, [zero_p, q1 / 6, p2 / (2 * math.sqrt(2)), zero_q]):
        torch.testing.assert_close(got, want)
    # paper: sum of f^2 -> 4 M E, here with a weight of 0.5
    value, _, grads = orthogonal_regularizer_grads(layers, "paper", weight=0.5)
    assert float(value) == 13.0
    for got, want in zip(grads, [zero_p, 2 * q1, 2 * p2, zero_q]):
        torch.testing.assert_close(got, want)
    assert [g.shape for g in grads] == [f.shape for f in factors]
    # laid out as the factors are, so one fused add takes them all (no per-tensor fallback)
    assert [g.stride() for g in grads] == [f.stride() for f in factors]


@pytest.mark.parametrize("form", ["code", "paper"])
def test_adding_the_closed_form_gradient_equals_autograd(form) -> None:
    """On random factors of three shapes (two layers share one), with a tensor weight: the
    gradients :meth:`OrthogonalRegularizer.add_gradients` adds equal autograd's of
    ``weight * R`` to fp32 rounding, added to a gradient already there, and given to a
    factor that had none; a frozen factor gets none, as under autograd."""
    torch.manual_seed(0)
    layers = [SVDLinear(nn.Linear(16, 8), 4, 8.0), SVDLinear(nn.Linear(16, 8), 4, 8.0),
              SVDLinear(nn.Linear(24, 40), 4, 8.0)]
    with torch.no_grad():
        for layer in layers:
            layer.P.normal_(0.0, 0.4)
            layer.Q.normal_(0.0, 0.4)
    layers[1].Q.requires_grad_(False)
    twins = [copy.deepcopy(layer) for layer in layers]
    x = torch.randn(5, 16)
    weight = torch.tensor(0.3)
    # autograd: the task loss through the first layer only, plus weight * R
    loss = layers[0](x).square().sum()
    (loss + weight * orthogonal_regularizer(layers, form)).backward()
    twins[0](x).square().sum().backward()  # the task's gradient first, as the engine does
    assert twins[2].P.grad is None
    value = OrthogonalRegularizer(twins, form).add_gradients(weight)
    assert float(value) == float(orthogonal_regularizer(layers, form).detach())
    assert layers[1].Q.grad is None and twins[1].Q.grad is None
    frozen = copy.deepcopy(twins[2])
    for p in frozen.parameters():
        p.requires_grad_(False)
    OrthogonalRegularizer([frozen], form).add_gradients(weight)  # nothing to add to
    assert all(p.grad is None for p in frozen.parameters())
    for layer, twin in zip(layers, twins):
        for name in ("P", "Q"):
            if not getattr(layer, name).requires_grad:
                continue
            want, got = getattr(layer, name).grad, getattr(twin, name).grad
            assert float(want.abs().max()) > 1e-3  # every factor really has a gradient
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
