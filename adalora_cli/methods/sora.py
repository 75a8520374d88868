"""SoRA (Ding et al., 2023): sparse low-rank adaptation (docs/maths.md#sora); :func:`build_sora`
is its builder.

Every adapted matrix is LoRA at rank ``r_max`` with a gate ``g`` on its ranks,
``Delta W = (alpha / r_max) B diag(g) A``. The gates train with the rest (in the optimizer's
group without weight decay, as the authors' separate gate optimizer has none) and, after
every optimizer step, a proximal step sparsifies them. Following the authors' released code
rather than the paper's equation (docs/maths.md#sora says where they differ):

- the loss carries ``l1 * mean(|g|)`` over every gate of the model (the regularizer hook);
- the gradient step is the optimizer's own (AdamW), and the proximal step then shrinks each
  gate by ``xi`` towards zero, zeroing it when ``|g| < 2 xi`` (what the code's three
  in-place masks do one after the other);
- ``xi`` may rise linearly to ``xi_max`` over ``xi_steps`` stages of training (the
  sparsifying scheduler, within one run).

A zero gate removes its rank: the rank of a matrix is its number of nonzero gates, and
"# Params" counts only those ranks (``d_out + d_in + 1`` each). A zeroed gate still gets a
gradient and may come back if a later step pushes it past the threshold.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from ..config import RunConfig, SoRAConfig
from .allocator import StepReport
from .base import MethodHandle, ParamGroup, head_parameters
from .building import adapter_params, fixed_rank, inject
from .lora import LoRALinear


class SoRALinear(LoRALinear):
    """LoRA at rank ``r_max`` whose ranks pass through a gate: ``s B diag(g) A``."""

    def __init__(self, base: nn.Module, r_max: int, alpha: float, dropout: float = 0.0):
        super().__init__(base, r_max, alpha, dropout)  # A Kaiming-uniform, B = 0
        kw = {"device": self.A.device, "dtype": torch.float32}
        self.gate = nn.Parameter(torch.randn(r_max, **kw))  # (r_max,), N(0, 1) as the code

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = (self.dropout(x) @ self.A.T) * self.gate  # (..., r_max)
        return self.base(x) + (z @ self.B.T) * self.scaling

    def delta_weight(self) -> torch.Tensor:
        """``s B diag(g) A``, shape ``(d_out, d_in)``; a zero gate adds nothing."""
        return (self.B * self.gate) @ self.A * self.scaling

    def adapter_parameters(self) -> Iterator[nn.Parameter]:
        yield from (self.A, self.B, self.gate)

    def extra_repr(self) -> str:
        return f"r_max={self.r}, scaling={self.scaling:g}"


def prox(g: torch.Tensor, xi: float) -> torch.Tensor:
    """The authors' proximal step on gates ``g`` after the gradient step: shrink by ``xi``
    towards zero and zero what falls below ``xi`` after shrinking, i.e. ``|g| < 2 xi``
    (docs/maths.md#sora). ``xi = 0`` leaves ``g`` as it is."""
    if xi <= 0:
        return g
    return torch.where(g.abs() >= 2 * xi, g - xi * torch.sign(g), torch.zeros_like(g))


def xi_at(t: int, total_steps: int, cfg: SoRAConfig) -> float:
    """``xi`` at step t: fixed, or the sparsifying schedule's stage ``j`` value
    ``xi + j (xi_max - xi) / (xi_steps - 1)`` for t in stage ``j = floor((t - 1) xi_steps / T)``."""
    if cfg.xi_max is None or cfg.xi_steps == 1:
        return cfg.xi
    j = min(cfg.xi_steps - 1, (t - 1) * cfg.xi_steps // total_steps)
    return cfg.xi + j * (cfg.xi_max - cfg.xi) / (cfg.xi_steps - 1)


def gate_l1(layers: Sequence[SoRALinear]) -> torch.Tensor:
    """``mean(|g|)`` over every gate of the model: the term the loss adds ``l1`` times."""
    return torch.cat([layer.gate.abs() for layer in layers]).mean()


class GateSparsifier:
    """The proximal step after each optimizer step, and the ranks the gates leave."""

    def __init__(self, layers: Sequence[tuple[str, SoRALinear]], cfg: SoRAConfig,
                 total_steps: int):
        self.paths = [path for path, _ in layers]
        self._layers = [layer for _, layer in layers]
        self.cfg, self.T = cfg, total_steps
        self._last: dict[str, int] | None = None

    @property
    def mask(self) -> torch.Tensor:
        """1 for every nonzero gate, over all matrices in order."""
        return torch.cat([(layer.gate.detach() != 0).float() for layer in self._layers])

    @torch.no_grad()
    def step(self, t: int, scored: bool = True, grad_scale: float = 1.0) -> StepReport:
        """Sparsify every gate (after ``optimizer.step()``); report the ranks when they
        changed.

        ``scored=False``: the fp16 loss scaler skipped this step, so no gradient step moved
        the gates and no proximal step follows it (the authors' proximal step is part of
        their gate optimizer's step); the gates and the pattern stay as they were.
        ``grad_scale`` plays no part: the proximal step reads no gradient."""
        if not scored:
            pattern = self._last if self._last is not None else self.rank_pattern()
            return StepReport(sum(pattern.values()), None)
        xi = xi_at(t, self.T, self.cfg)
        for layer in self._layers:
            layer.gate.copy_(prox(layer.gate, xi))
        pattern = self.rank_pattern()
        changed = pattern != self._last
        self._last = pattern
        return StepReport(sum(pattern.values()), pattern if changed else None)

    def rank_pattern(self) -> dict[str, int]:
        """Every matrix's number of nonzero gates (one device sync for all of them)."""
        counts = torch.stack([(layer.gate.detach() != 0).sum() for layer in self._layers])
        return dict(zip(self.paths, (int(c) for c in counts.tolist())))

    def final_adapter_params(self) -> int:
        """``d_out + d_in + 1`` per nonzero gate: the ranks that remain."""
        return sum(rank * (layer.out_features + layer.in_features + 1)
                   for rank, layer in zip(self.rank_pattern().values(), self._layers))

    def state_dict(self) -> dict[str, Any]:
        return {"paths": list(self.paths), "last": self._last}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if list(state["paths"]) != self.paths:
            raise ValueError("SoRA state was saved for different adapted matrices")
        self._last = state["last"]



def build_sora(model: nn.Module, cfg: RunConfig, total_steps: int | None) -> MethodHandle:
    so = cfg.sora  # docs/maths.md#sora
    layers = inject(model, cfg, so.r_max, "sora.r_max",
                    lambda lin: SoRALinear(lin, so.r_max, so.alpha, so.dropout))
    modules = [layer for _, layer in layers]
    gates = [layer.gate for layer in modules]
    gate_ids = {id(g) for g in gates}
    head = head_parameters(model)
    rest = [p for p in [*adapter_params(layers), *head] if id(p) not in gate_ids]
    # the gates have their own optimizer without weight decay in the authors' code
    groups = [ParamGroup(rest), ParamGroup(gates, weight_decay=False)]
    sparsifier = GateSparsifier(layers, so, total_steps) if total_steps is not None else None
    return fixed_rank(model, cfg, layers, groups=groups, reg_weight=so.l1,
                      regularizer=(lambda: gate_l1(modules)) if so.l1 > 0 else None,
                      reg_name="gate_l1", allocator=sparsifier,
                      after_step=sparsifier.step if sparsifier else None)
