"""Eq. 3's ``diag(lam)``: the rank-space activations ``z = Q x`` times ``lam``, as one
autograd function (docs/maths.md#svd-adaptation).

``lam`` is trained in fp32 whatever the activations' dtype. Under bf16 (or fp16) autocast,
``z`` comes out of a low-precision matmul, and the plain ``z * lam`` promotes the whole
``(..., r0)`` product to fp32, which autocast then casts back for the matmul with ``P``;
its backward casts the gradient up, multiplies it by ``lam``, casts that back down, and
multiplies and sums it against ``z`` for ``lam``'s gradient. On a GPU each of these is a
kernel of its own, for every adapted matrix, on a step bound by the host's launches.

:class:`ScaledRank` does the same arithmetic in fewer operations: each product is computed
in fp32 and written straight into the dtype the plain path ends in (one operation where there
were a multiply and a cast), and ``lam``'s gradient is the fp32 sum of the exact fp32
products of the low-precision gradient and ``z``, as before. Forward and backward equal the
plain path's bit for bit, in fp32 and under autocast (``tests/methods/test_scaled_rank.py``),
so the importance scores (Eqs. 8-10) read the same fp32 gradient of ``lam``.

Where ``z`` is already fp32 there is nothing to fuse, and :func:`scaled_rank` leaves the
product to autograd's own multiply, which costs no Python in the backward pass.
"""

from __future__ import annotations

from typing import Any

import torch

_ZEROS: dict[torch.device, torch.Tensor] = {}


def _fp32_zero(device: torch.device) -> torch.Tensor:
    """A one-entry fp32 ``-0.0`` on ``device``, made once. Added to a product of two bf16
    tensors it makes the product's dtype fp32 (a sized tensor takes part in type promotion,
    a 0-dim one would not), so the multiply runs in fp32, where a product of two bf16 or
    fp16 values is exact; ``-0.0`` is the one number whose addition changes no float, the
    sign of a zero included."""
    zero = _ZEROS.get(device)
    if zero is None:
        zero = _ZEROS[device] = torch.full((1,), -0.0, dtype=torch.float32, device=device)
    return zero


class ScaledRank(torch.autograd.Function):
    """``z * lam`` with ``z`` (..., r0) in a low-precision dtype and ``lam`` (r0,) in fp32;
    the result in ``z``'s dtype, rounded once from the fp32 product."""

    @staticmethod
    def forward(ctx: Any, z: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(z, lam)
        # computed in the promoted fp32, written in z's dtype: the multiply and the cast
        # autocast would add before the matmul with P, in one operation
        return torch.mul(z, lam, out=torch.empty_like(z))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z, lam = ctx.saved_tensors
        grad_z = grad_lam = None
        if ctx.needs_input_grad[0]:
            # d/dz: grad * lam in fp32, written in z's dtype, as the plain path's cast does
            grad_z = torch.mul(grad, lam, out=torch.empty_like(z))
        if ctx.needs_input_grad[1]:
            # d/dlam (fp32): the exact fp32 products summed over every leading dim, in the
            # order autograd's broadcast reduction (sum_to) sums them
            prod = torch.addcmul(_fp32_zero(grad.device), grad, z)  # (..., r0), fp32
            grad_lam = prod.sum_to_size(lam.shape)
        return grad_z, grad_lam


def scaled_rank(z: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """``z * lam`` for Eq. 3, in ``z``'s dtype when that is not ``lam``'s (autocast); in fp32
    the plain product, which is already as few operations as it can be."""
    if z.dtype == lam.dtype:
        return z * lam
    return ScaledRank.apply(z, lam)
