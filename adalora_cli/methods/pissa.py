"""PiSSA (Meng et al., 2024): LoRA started on W0's principal singular triplets
(docs/maths.md#pissa); :func:`build_pissa` is its builder.

With ``W0 = U S V^T`` and scaling ``s = alpha / r``, ``B`` and ``A`` start as
``B0 = U_r sqrt(S_r / s)`` and ``A0 = sqrt(S_r / s) V_r^T``, so ``s B0 A0`` is W0's best
rank-r part, and the frozen base must become the residual ``W_res = W0 - s B0 A0`` for the
model to compute ``W0`` at step 0. The adapted layer computes

    h = W0 x + b - s B0 A0 x + s B A dropout(x)  =  W_res x + b + s B A dropout(x)

What this means for the saved base: the runner never rewrites the base weight. ``A0`` and
``B0`` are kept as frozen tensors of the layer and saved with the trained ones, so the
original checkpoint plus the run's weights give back exactly the trained model (a fresh SVD
on another device could pick a slightly different principal subspace). The update to W0 is
``s (B A - B0 A0)``, which merging folds in and the PEFT export writes as a rank-2r LoRA on
the original W0.
"""

from __future__ import annotations

import torch
from torch import nn

from ..config import RunConfig
from .base import MethodHandle
from .building import fixed_rank, inject
from .lora import LoRALinear


class PiSSALinear(LoRALinear):
    """LoRA whose ``B A`` starts as W0's principal part and whose base keeps the rest."""

    def __init__(self, base: nn.Module, r: int, alpha: float, dropout: float = 0.0):
        super().__init__(base, r, alpha, dropout)
        B0, A0 = principal_factors(self._base_weight(), r, self.scaling)
        with torch.no_grad():
            self.A.copy_(A0)
            self.B.copy_(B0)
        # frozen and saved with the run (MethodHandle.kept): the residual is defined by them
        self.A0 = nn.Parameter(A0.clone(), requires_grad=False)  # (r, d_in)
        self.B0 = nn.Parameter(B0.clone(), requires_grad=False)  # (d_out, r)

    def _base_weight(self) -> torch.Tensor:
        w = self.base.weight  # (d_out, d_in); (d_in, d_out) for a Conv1D
        return w.T if self.fan_in_fan_out else w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        principal = (x @ self.A0.T) @ self.B0.T  # s B0 A0 x leaves W0 x as W_res x
        adapted = (self.dropout(x) @ self.A.T) @ self.B.T
        return self.base(x) + (adapted - principal) * self.scaling

    def delta_weight(self) -> torch.Tensor:
        """``s (B A - B0 A0)``, shape ``(d_out, d_in)``: the update to the original W0."""
        return (self.B @ self.A - self.B0 @ self.A0) * self.scaling

    def extra_repr(self) -> str:
        return f"r={self.r}, scaling={self.scaling:g}, principal init"


@torch.no_grad()
def principal_factors(w0: torch.Tensor, r: int, scaling: float
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(B0, A0)`` of shapes ``(d_out, r)`` and ``(r, d_in)`` with
    ``scaling * B0 @ A0`` = the best rank-r approximation of ``w0`` (its top r singular
    triplets, exact SVD in fp32); the singular values are split evenly between the two."""
    U, S, Vh = torch.linalg.svd(w0.float(), full_matrices=False)  # W0 = U diag(S) Vh
    root = torch.sqrt(S[:r] / scaling)  # (r,)
    return U[:, :r] * root, root.unsqueeze(1) * Vh[:r]


def build_pissa(model: nn.Module, cfg: RunConfig, total_steps: int | None) -> MethodHandle:
    pi = cfg.pissa  # docs/maths.md#pissa: alpha = r unless set (s = 1)
    alpha = float(pi.r) if pi.alpha is None else pi.alpha
    layers = inject(model, cfg, pi.r, "pissa.r",
                    lambda lin: PiSSALinear(lin, pi.r, alpha, pi.dropout))
    kept = [p for _, layer in layers for p in (layer.A0, layer.B0)]
    return fixed_rank(model, cfg, layers, kept=kept)
