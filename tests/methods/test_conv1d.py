"""GPT-2's ``Conv1D`` (``y = x W + b`` with ``W`` stored ``(d_in, d_out)``) adapted by LoRA,
AdaLoRA and the bottleneck adapters, checked against the same maths on an ``nn.Linear``."""

from __future__ import annotations

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from adalora_cli.methods.adalora import SVDLinear
from adalora_cli.methods.adapters import HoulsbyAdapter
from adalora_cli.methods.lora import LoRALinear

D_IN, D_OUT = 7, 5


def _conv_and_linear(seed: int = 0) -> tuple[Conv1D, nn.Linear]:
    torch.manual_seed(seed)
    conv = Conv1D(D_OUT, D_IN)  # nf = d_out, nx = d_in
    nn.init.normal_(conv.weight)
    nn.init.normal_(conv.bias)
    linear = nn.Linear(D_IN, D_OUT)
    with torch.no_grad():
        linear.weight.copy_(conv.weight.T)
        linear.bias.copy_(conv.bias)
    return conv, linear


def test_lora_on_conv1d_is_lora_on_the_same_linear() -> None:
    conv, linear = _conv_and_linear()
    a, b = LoRALinear(conv, r=3, alpha=6.0), LoRALinear(linear, r=3, alpha=6.0)
    assert (a.A.shape, a.B.shape) == ((3, D_IN), (D_OUT, 3))
    assert (a.in_features, a.out_features, a.fan_in_fan_out) == (D_IN, D_OUT, True)
    assert sum(p.numel() for p in a.adapter_parameters()) == 3 * (D_IN + D_OUT)
    with torch.no_grad():
        a.A.normal_()
        a.B.normal_()
        b.A.copy_(a.A)
        b.B.copy_(a.B)
    x = torch.randn(2, 4, D_IN)
    by_hand = x @ conv.weight + conv.bias + 2.0 * (x @ a.A.T) @ a.B.T  # alpha / r = 2
    torch.testing.assert_close(a(x), by_hand)
    torch.testing.assert_close(a(x), b(x))


def test_adalora_on_conv1d_and_its_merge_into_the_transposed_weight() -> None:
    conv, _ = _conv_and_linear(1)
    layer = SVDLinear(conv, r0=4, alpha=8.0)
    assert (layer.P.shape, layer.lam.shape, layer.Q.shape) == ((D_OUT, 4), (4,), (4, D_IN))
    with torch.no_grad():
        layer.lam.copy_(torch.tensor([1.5, 0.0, -2.0, 0.5]))
    x = torch.randn(3, D_IN)
    # Eq. 3: W0 x + (alpha / r0) P diag(lam) Q x, with W0 x = x @ conv.weight here
    by_hand = x @ conv.weight + conv.bias + 2.0 * ((x @ layer.Q.T) * layer.lam) @ layer.P.T
    torch.testing.assert_close(layer(x), by_hand)
    merged = Conv1D(D_OUT, D_IN)
    with torch.no_grad():
        merged.weight.copy_(conv.weight + layer.to_base_layout(layer.delta_weight()))
        merged.bias.copy_(conv.bias)
    assert merged.weight.shape == (D_IN, D_OUT)
    torch.testing.assert_close(merged(x), by_hand)


def test_houlsby_adapter_reads_the_conv1d_output_width() -> None:
    conv, _ = _conv_and_linear(2)
    adapter = HoulsbyAdapter(conv, dim=3)
    assert adapter.down.weight.shape == (3, D_OUT) and adapter.up.weight.shape == (D_OUT, 3)
    x = torch.randn(2, D_IN)
    torch.testing.assert_close(adapter(x), conv(x))  # up starts at zero: the identity
