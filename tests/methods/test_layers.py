"""SVDLinear, LoRALinear and the orthogonal regularizer against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from adalora_cli.methods.adalora import SVDLinear, orthogonal_regularizer
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
