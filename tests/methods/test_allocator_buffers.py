"""The allocator's in-place score buffers compute bit for bit what the plain formulas
compute (``|cat(w * grad)|`` and the two EMAs with a fresh ``|I - I_bar|``), reuse their
memory from step to step, and keep the plain path for parameters that are not fp32."""

from __future__ import annotations

import torch

from tests.methods.test_allocator import _alloc, _layers, _plain_update, _random_grads


def _plain(params, I_bar, U_bar, beta1, beta2):
    """Eqs. 8-10 with fresh tensors for every intermediate (the allocator's former code)."""
    I = torch.cat([(p.detach() * p.grad).reshape(-1) for p in params]).abs()
    I_bar = I_bar.mul(beta1).add(I, alpha=1 - beta1)
    U_bar = U_bar.mul(beta2).add((I - I_bar).abs(), alpha=1 - beta2)
    return I, I_bar, U_bar


def test_in_place_updates_equal_the_plain_formulas_bitwise():
    for kind in ("svd", "lora"):
        layers = _layers(kind)
        alloc = _alloc(layers, beta1=0.7, beta2=0.9)
        buffers = (alloc.I.data_ptr(), alloc._scratch.data_ptr())
        I_bar, U_bar = torch.zeros_like(alloc.I_bar), torch.zeros_like(alloc.U_bar)
        for t in (1, 2, 3):
            _random_grads(layers, seed=10 + t)
            _plain_update(layers)
            alloc.step(t)
            I, I_bar, U_bar = _plain(alloc.params, I_bar, U_bar, 0.7, 0.9)
            assert torch.equal(alloc.I, I)
            assert torch.equal(alloc.I_bar, I_bar) and torch.equal(alloc.U_bar, U_bar)
        assert (alloc.I.data_ptr(), alloc._scratch.data_ptr()) == buffers  # no new tensors


def test_non_fp32_parameters_take_the_product_in_their_own_dtype():
    layers = _layers()
    for _, layer in layers:
        layer.to(torch.bfloat16)
    alloc = _alloc(layers)
    assert alloc._I_views is None
    g = torch.Generator().manual_seed(3)
    for _, layer in layers:
        for p in layer.adapter_parameters():
            p.grad = torch.randn(p.shape, generator=g).to(torch.bfloat16)
    alloc.step(1)
    expected = torch.cat([(p.detach() * p.grad).reshape(-1) for p in alloc.params])
    expected = expected.float().abs()
    assert alloc.I.dtype == torch.float32 and torch.equal(alloc.I, expected)
