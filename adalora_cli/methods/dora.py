"""DoRA (Liu et al., 2024): weight-decomposed low-rank adaptation (docs/maths.md#dora);
:func:`build_dora` is its builder.

The adapted weight is a magnitude times a direction, ``W' = m * V / ||V||`` with
``V = W0 + s B A`` and the norm taken per output feature (over ``d_in``). ``m`` (one entry
per output feature) starts at ``||W0||``, so ``W' = W0`` at step 0 (``B = 0``); ``A``, ``B``
and ``m`` train. As the paper's Sec. 4.3 recommends (and PEFT does), ``||V||`` is treated
as a constant in the backward pass: it follows ``B A`` in value, but no gradient flows
through it.

The forward never forms ``W'``: ``W' x = (m / ||V||) * (W0 x + s B A x)``, and ``W0 x`` is
the base layer's own output (minus its bias), so the only full-size work per step is the
norm of ``V``.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from ..config import RunConfig
from .base import MethodHandle, dense
from .building import fixed_rank, inject
from .lora import LoRALinear


class DoRALinear(LoRALinear):
    """A frozen linear whose weight becomes ``m * (W0 + s B A) / ||W0 + s B A||``."""

    def __init__(self, base: nn.Module, r: int, alpha: float, dropout: float = 0.0,
                 rslora: bool = False):
        super().__init__(base, r, alpha, dropout, rslora)
        with torch.no_grad():
            norm = torch.linalg.vector_norm(self.base_weight().float(), dim=1)  # (d_out,)
        self.m = nn.Parameter(norm)  # ||W0|| per output feature: W' = W0 at step 0

    def base_weight(self) -> torch.Tensor:
        """``W0`` in ``(d_out, d_in)`` layout whatever the base layer stores."""
        w = dense(self.base.weight)  # a 4-bit NF4 base dequantized: W0 as the forward sees it
        return w.T if self.fan_in_fan_out else w

    def _direction_norm(self) -> torch.Tensor:
        """``||W0 + s B A||`` per output feature, ``(d_out,)``, detached (Sec. 4.3)."""
        with torch.no_grad():
            v = self.base_weight().float() + self.scaling * (self.B @ self.A)
            return torch.linalg.vector_norm(v, dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)  # W0 x + b
        xd = self.dropout(x)
        scale = self.m / self._direction_norm()  # (d_out,): m / ||V||
        if xd is x:  # no dropout: W0 x is the base output without its bias
            bias = self.base.bias
            w0x = out - bias if bias is not None else out
        else:  # the magnitude path sees the same dropped input as B A, as in PEFT
            w0x = F.linear(xd, self.base_weight().to(xd.dtype))
        lora = (xd @ self.A.T) @ self.B.T * self.scaling  # (..., d_out)
        # W' x + b = b + scale * (W0 x + s B A x), written as a correction to W0 x + b
        return (out + (scale - 1) * w0x + scale * lora).to(out.dtype)

    @torch.no_grad()
    def delta_weight(self) -> torch.Tensor:
        """``W' - W0``, shape ``(d_out, d_in)``: what merging adds to the base weight."""
        w0 = self.base_weight().float()
        v = w0 + self.scaling * (self.B @ self.A)
        return (self.m / torch.linalg.vector_norm(v, dim=1)).unsqueeze(1) * v - w0

    def adapter_parameters(self) -> Iterator[nn.Parameter]:
        yield from (self.A, self.B, self.m)

    def extra_repr(self) -> str:
        return f"r={self.r}, scaling={self.scaling:g}, magnitude={self.m.numel()}"


def build_dora(model: nn.Module, cfg: RunConfig, total_steps: int | None) -> MethodHandle:
    do = cfg.dora  # docs/maths.md#dora: A, B and the magnitude m train
    layers = inject(model, cfg, do.r, "dora.r",
                    lambda lin: DoRALinear(lin, do.r, do.alpha, do.dropout, do.rslora))
    return fixed_rank(model, cfg, layers)
