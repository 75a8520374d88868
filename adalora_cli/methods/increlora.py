"""IncreLoRA (Zhang et al., 2023): AdaLoRA's SVD form grown from a small rank up to the
budget b(T) (docs/maths.md#increlora); :func:`build_increlora` is its builder, the growth plan
it follows is ``growth.py``'s.

Every adapted matrix starts at ``init_rank`` triplets ``(P[:, i], lam[i], Q[i, :])`` and
``Delta W = (alpha / rank) P diag(lam) Q`` with its *current* rank, as the authors' code
scales it. The rank grows at growth events (every ``delta_t`` steps after ``t_init``): the
``top_h`` matrices with the highest importance gain ``add_rank`` triplets each, until the
total rank reaches b(T). A matrix's importance is the sensitivity of its whole update,
``sum |Delta W * dL/dDelta W| / sqrt(d_out d_in)``, smoothed and multiplied by its
uncertainty exactly as AdaLoRA's Eqs. (9)-(11) do for one entry.

With advance learning (``reserve``) every matrix also holds ``add_rank`` reserve triplets
whose ``lam`` is fixed at 1e-5 while their ``P`` and ``Q`` train; a growth event makes them
ordinary triplets (``lam`` trained from 1e-5) and draws new reserves. When the budget is
reached the reserves' ``lam`` is set to 0 and the growth stops.

The tensors are allocated once, at the largest rank the growth plan can reach
(``capacity``); triplets not born yet have ``lam = 0`` and ``P``/``Q`` at 0, so they take no
part in the forward and get no gradient. The masks ``born`` (triplet exists: ordinary or
reserve) and ``active`` (ordinary) are frozen tensors saved with the weights.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ConfigError, RunConfig
from .allocator import StepReport
from .base import LinearWrapper, MethodHandle, linear_dims, optional_dropout
from .building import fixed_rank
from .growth import GrowthPlan, plan_growth
from .inject import replace_linears, resolve_targets

RESERVE_LAM = 1e-5
"""``lam`` of a reserve triplet while the growth runs (the authors' advance learning)."""
INIT_STD = 0.02
"""``P`` and ``Q`` of a new triplet ~ N(0, 0.02), as AdaLoRA's (docs/maths.md#svd-adaptation)."""


class IncreLoRALinear(LinearWrapper):
    """``h = W0 x + b + (alpha / rank) P diag(lam) Q dropout(x)`` with a growing rank."""

    def __init__(self, base: nn.Module, capacity: int, init_rank: int, reserve: int,
                 alpha: float, dropout: float = 0.0):
        super().__init__(base)
        self.capacity, self.alpha = capacity, alpha
        self.dropout = optional_dropout(dropout)
        d_out, d_in = linear_dims(base)
        kw = {"device": base.weight.device, "dtype": torch.float32}
        born = init_rank + reserve
        self.P = nn.Parameter(torch.zeros(d_out, capacity, **kw))  # (d_out, capacity)
        self.lam = nn.Parameter(torch.zeros(capacity, **kw))  # (capacity,)
        self.Q = nn.Parameter(torch.zeros(capacity, d_in, **kw))  # (capacity, d_in)
        self.born = nn.Parameter(torch.zeros(capacity, **kw), requires_grad=False)
        self.active = nn.Parameter(torch.zeros(capacity, **kw), requires_grad=False)
        with torch.no_grad():
            self.P[:, :born].normal_(0.0, INIT_STD)
            self.Q[:born].normal_(0.0, INIT_STD)
            self.lam[init_rank:born] = RESERVE_LAM
            self.born[:born] = 1.0
            self.active[:init_rank] = 1.0
        self._start = (init_rank, born)
        self.scoring = False
        """True while the growth runs: the forward forms Delta W to collect its gradient."""
        self._dw: torch.Tensor | None = None
        self._grad: torch.Tensor | None = None

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        """A run rebuilt without its T (``load_run``) cannot know how much room the growth
        plan gave each matrix: take it from the saved tensors."""
        saved = state_dict.get(prefix + "lam")
        if saved is not None and saved.shape[0] != self.capacity:
            self._resize(saved.shape[0])
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _resize(self, capacity: int) -> None:
        """Fresh zero tensors for ``capacity`` triplets (before loading saved values)."""
        for name in ("P", "lam", "Q", "born", "active"):
            old = getattr(self, name)
            shape = list(old.shape)
            shape[1 if name == "P" else 0] = capacity
            setattr(self, name, nn.Parameter(old.new_zeros(shape),
                                             requires_grad=old.requires_grad))
        self.capacity = capacity

    # ------------------------------------------------------------------ forward

    def _lam(self) -> torch.Tensor:
        """``lam`` with a gradient only for ordinary triplets (a reserve's stays 1e-5)."""
        return self.lam * self.active + (self.lam * (1 - self.active)).detach()

    def scaling(self) -> torch.Tensor:
        return self.alpha / self.active.sum()  # alpha / current rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xd = self.dropout(x)
        if self.scoring and torch.is_grad_enabled():
            dw = (self.P * self._lam()) @ self.Q * self.scaling()  # (d_out, d_in)
            if dw.requires_grad:
                dw.register_hook(self._add_grad)
            self._dw = dw.detach()
            return self.base(x) + F.linear(xd, dw.to(xd.dtype))
        z = (xd @ self.Q.T) * self._lam()  # (..., capacity)
        return self.base(x) + (z @ self.P.T) * self.scaling()

    def _add_grad(self, grad: torch.Tensor) -> None:
        """dL/dDelta W of this step, summed over its micro-batches."""
        g = grad.detach().float()
        self._grad = g.clone() if self._grad is None else self._grad + g

    def drop_collected(self) -> None:
        """Forget this step's Delta W and gradient (a step the loss scaler skipped)."""
        self._dw, self._grad = None, None

    def take_sensitivity(self) -> torch.Tensor:
        """This step's ``sum |Delta W * dL/dDelta W| / sqrt(d_out d_in)`` (a 0-d fp32 tensor
        on the layer's device); 0 without a gradient. Clears what the step collected."""
        dw, grad, self._dw, self._grad = self._dw, self._grad, None, None
        if dw is None or grad is None:
            return torch.zeros((), device=self.lam.device)
        return (dw.float() * grad).abs().sum() / math.sqrt(dw.numel())

    def delta_weight(self) -> torch.Tensor:
        """``(alpha / rank) P diag(lam) Q``, shape ``(d_out, d_in)``."""
        return (self.P * self.lam) @ self.Q * self.scaling()

    # ------------------------------------------------------------------ growth

    def counts(self) -> tuple[int, int]:
        """(ordinary triplets, born triplets); the starting ones on the meta device (a dry
        run, which has no values to count)."""
        if self.active.is_meta:
            return self._start
        return int(self.active.sum().item()), int(self.born.sum().item())

    @torch.no_grad()
    def grow(self, give: int, reserve: bool, generator: torch.Generator) -> None:
        """``give`` more ordinary triplets. With reserves (advance learning) the first
        ``give`` reserves become ordinary, their ``lam`` trained on from 1e-5, and ``give``
        new reserves are drawn behind them; without, ``give`` fresh triplets are drawn."""
        rank, born = self.counts()
        if born + give > self.capacity:
            raise RuntimeError(f"IncreLoRA grew past its capacity ({self.capacity})")
        self._draw(born, born + give, generator)
        if reserve:
            self.lam[born:born + give] = RESERVE_LAM  # the new reserves wait at 1e-5
        self.active[rank:rank + give] = 1.0

    def _draw(self, lo: int, hi: int, generator: torch.Generator) -> None:
        """New triplets ``lo..hi-1``: P, Q ~ N(0, 0.02) from the grower's own generator (the
        same on every process), ``lam = 0``."""
        d_out, d_in = self.P.shape[0], self.Q.shape[1]
        p = torch.randn(d_out, hi - lo, generator=generator) * INIT_STD
        q = torch.randn(hi - lo, d_in, generator=generator) * INIT_STD
        self.P[:, lo:hi] = p.to(self.P.device)
        self.Q[lo:hi] = q.to(self.Q.device)
        self.lam[lo:hi] = 0.0
        self.born[lo:hi] = 1.0

    @torch.no_grad()
    def hold_reserves(self, value: float) -> None:
        """Reserve ``lam`` back to ``value`` (weight decay would move it; 0 once grown)."""
        reserve = (self.born - self.active).bool()
        self.lam[reserve] = value

    def adapter_parameters(self) -> Iterator[nn.Parameter]:
        yield from (self.P, self.lam, self.Q)

    def counted_parameters(self) -> int:
        """Parameters of the born triplets (``d_out + d_in + 1`` each): what trains now."""
        return self.counts()[1] * (self.out_features + self.in_features + 1)

    def extra_repr(self) -> str:
        rank, born = self.counts()
        return f"rank={rank}, born={born}, capacity={self.capacity}, alpha={self.alpha:g}"


def born_orthogonality(layers: Sequence[IncreLoRALinear]) -> torch.Tensor:
    """Eq. 4 in code form over the born triplets only: the mean over all 2n factors of
    ``||P_b^T P_b - I||_F`` and ``||Q_b Q_b^T - I||_F`` (docs/maths.md#increlora).

    With the unborn columns zeroed, ``P~ = P diag(born)`` gives
    ``P~^T P~ - diag(born)``, whose only nonzero block is the born one's ``P_b^T P_b - I``."""
    norms = []
    for layer in layers:
        m = layer.born  # (capacity,)
        eye = torch.diag(m)
        p = layer.P * m  # (d_out, capacity)
        q = layer.Q * m.unsqueeze(1)  # (capacity, d_in)
        norms.append(torch.linalg.matrix_norm(p.T @ p - eye))
        norms.append(torch.linalg.matrix_norm(q @ q.T - eye))
    return torch.stack(norms).mean()


class RankGrower:
    """Scores each matrix every step while the growth runs and grows the chosen ones."""

    def __init__(self, layers: Sequence[tuple[str, IncreLoRALinear]], plan: GrowthPlan,
                 beta1: float, beta2: float, seed: int):
        self.paths = [path for path, _ in layers]
        self._layers = [layer for _, layer in layers]
        self.plan, self.beta1, self.beta2 = plan, beta1, beta2
        n = len(self._layers)
        self.I_bar = torch.zeros(n, dtype=torch.float64)  # Eq. 9 per matrix, starts at 0
        self.U_bar = torch.zeros(n, dtype=torch.float64)  # Eq. 10 per matrix
        self.generator = torch.Generator().manual_seed(seed)
        self._sync_scoring()

    def total(self) -> int:
        return sum(layer.counts()[0] for layer in self._layers)

    @property
    def growing(self) -> bool:
        return self.total() < self.plan.budget

    @property
    def mask(self) -> torch.Tensor:
        return torch.cat([layer.active.detach().cpu() for layer in self._layers])

    def _sync_scoring(self) -> None:
        growing = self.growing
        for layer in self._layers:
            layer.scoring = growing

    def sensitivities(self, grad_scale: float = 1.0) -> torch.Tensor:
        """Every matrix's sensitivity this step, ``(n,)``, from its collected gradient
        (averaged over processes first, like every other gradient). The hook collected
        dL/dDelta W of the loss times the fp16 loss scale ``grad_scale``; the sensitivity is
        linear in it, so dividing it out gives the true one."""
        for layer in self._layers:
            _all_reduce_mean(layer._grad)
        scores = [layer.take_sensitivity() for layer in self._layers]
        stacked = torch.stack([s.to(scores[0].device) for s in scores]).double().cpu()  # one sync
        return stacked / grad_scale if grad_scale != 1.0 else stacked

    @torch.no_grad()
    def step(self, t: int, scored: bool = True, grad_scale: float = 1.0) -> StepReport:
        """After ``optimizer.step()``: update the scores, grow at a growth event.

        ``scored=False``: the fp16 loss scaler skipped this step (its gradients are not
        finite), so what the layers collected is dropped and the averages stay as they
        were; as AdaLoRA's allocator does, ``t`` still counts it and a growth event due at
        ``t`` uses the averages so far. ``grad_scale``: the fp16 loss scale of this step's
        backward, divided out of the collected gradients (:meth:`sensitivities`)."""
        if not self.growing:
            return StepReport(self.total())
        if scored:
            I = self.sensitivities(grad_scale)  # (n,)
            self.I_bar.mul_(self.beta1).add_(I, alpha=1 - self.beta1)  # Eq. 9
            self.U_bar.mul_(self.beta2).add_((I - self.I_bar).abs(),
                                             alpha=1 - self.beta2)  # Eq. 10
        else:
            for layer in self._layers:
                layer.drop_collected()
        ranks = None
        if self.plan.is_event(t):
            self.grow(self.I_bar * self.U_bar)  # Eq. 11 per matrix
            ranks = self.rank_pattern()
        done = not self.growing
        for layer in self._layers:
            layer.hold_reserves(0.0 if done else RESERVE_LAM)
        self._sync_scoring()
        return StepReport(self.total(), ranks)

    def grow(self, scores: torch.Tensor) -> None:
        """The ``top_h`` highest-scoring matrices gain ``add_rank`` triplets each (the last
        ones fewer, so that the total stops at exactly b(T)); ties go to the earlier
        matrix."""
        left = self.plan.budget - self.total()
        order = torch.argsort(-scores, stable=True).tolist()
        for k in order[:self.plan.top_h]:
            if left <= 0:
                break
            give = min(self.plan.add_rank, left)
            self._layers[k].grow(give, self.plan.reserve, self.generator)
            left -= give

    def rank_pattern(self) -> dict[str, int]:
        return {path: layer.counts()[0] for path, layer in zip(self.paths, self._layers)}

    def final_adapter_params(self) -> int:
        """``d_out + d_in + 1`` per ordinary triplet: what the model keeps."""
        return sum(layer.counts()[0] * (layer.out_features + layer.in_features + 1)
                   for layer in self._layers)

    def state_dict(self) -> dict[str, Any]:
        return {"paths": list(self.paths), "I_bar": self.I_bar.clone(),
                "U_bar": self.U_bar.clone(), "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The scores and the generator; the masks come back with the weights."""
        if list(state["paths"]) != self.paths:
            raise ValueError("IncreLoRA state was saved for different adapted matrices")
        self.I_bar.copy_(state["I_bar"])
        self.U_bar.copy_(state["U_bar"])
        self.generator.set_state(state["generator"])
        self._sync_scoring()


def _all_reduce_mean(grad: torch.Tensor | None) -> None:
    """Average a collected gradient over the processes of a distributed run (the same
    average DDP takes of every parameter's gradient); nothing on one process."""
    import torch.distributed as dist

    if grad is None or not (dist.is_available() and dist.is_initialized()):
        return
    size = dist.get_world_size()
    if size > 1:
        dist.all_reduce(grad)
        grad.div_(size)


def build_increlora(model: nn.Module, cfg: RunConfig, total_steps: int | None
                    ) -> MethodHandle:
    ic = cfg.increlora  # docs/maths.md#increlora
    paths = resolve_targets(model, cfg.method.target_modules)
    plan = plan_growth(cfg, len(paths), total_steps)  # an impossible plan fails here
    smallest = min(min(linear_dims(model.get_submodule(p))) for p in paths)
    if plan.capacity > smallest:
        raise ConfigError(
            f"IncreLoRA would need room for {plan.capacity} ranks in one matrix (it may be "
            f"chosen at each of {plan.rounds} growth events), more than the smallest adapted "
            f"dimension ({smallest}); raise increlora.top_h or increlora.add_rank")
    reserve = plan.add_rank if plan.reserve else 0
    layers = replace_linears(model, paths, lambda lin: IncreLoRALinear(
        lin, plan.capacity, ic.init_rank, reserve, ic.alpha, ic.dropout))
    modules = [layer for _, layer in layers]
    # counted before any growth: a resumed or reloaded run counts what a fresh one does
    start = sum(layer.counted_parameters() for layer in modules)
    grower = (RankGrower(layers, plan, ic.beta1, ic.beta2, cfg.train.seed)
              if total_steps is not None else None)
    return fixed_rank(
        model, cfg, layers, reg_weight=ic.gamma,
        regularizer=(lambda: born_orthogonality(modules)) if ic.gamma > 0 else None,
        allocator=grower, after_step=grower.step if grower else None,
        kept=[p for layer in modules for p in (layer.born, layer.active)],
        adapter_count=start)
