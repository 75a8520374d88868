"""Eq. 3's diag(lam) as one autograd function (methods/scaled_rank.py) on the GPU: under the
GPU's own bf16 and fp16 autocast, the output and the gradients of x, P, lam and Q equal the
plain multiply's bit for bit, as on the CPU (tests/methods/test_scaled_rank.py). The same
operations run on both devices; a GPU casts mixed dtypes inside the kernel where the CPU
makes temporaries, which changes no bit of the result."""

from __future__ import annotations

import pytest
import torch

from adalora_cli.methods.adalora import SVDLinear
from tests.methods.test_scaled_rank import _bits, _layer, _plain

from .conftest import GPU


def _run(layer, forward, x, dtype):
    for p in layer.parameters():
        p.grad = None
    x = x.clone().requires_grad_()
    with torch.autocast(GPU.type, dtype=dtype):
        out = forward(layer, x)
        loss = (out.float() * torch.linspace(-1, 1, out.shape[-1], device=GPU)).pow(2).sum()
    loss.backward()
    return [out, x.grad, layer.P.grad, layer.lam.grad, layer.Q.grad]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_fused_equals_plain_bit_for_bit_under_the_devices_autocast(dtype):
    layer = _layer().to(GPU)
    x = torch.randn(4, 9, 24, device=GPU)
    fused = _run(layer, SVDLinear.forward, x, dtype)
    plain = _run(layer, _plain, x, dtype)
    for name, f, p in zip(["output", "x.grad", "P.grad", "lam.grad", "Q.grad"], fused, plain):
        assert f.dtype == p.dtype and torch.equal(_bits(f), _bits(p)), name
    assert fused[0].dtype == dtype and fused[3].dtype == torch.float32
    assert fused[3].abs().min() > 0  # a real gradient for every entry of lam
