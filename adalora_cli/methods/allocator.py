"""Importance-aware rank allocation (Sec. 3.2-3.3, Algorithm 1, Eqs. (5)-(12);
docs/maths.md#importance-score to docs/maths.md#masking).

:func:`budget_schedule` is a pure function of the step: the corrected cubic of Appendix A.
:class:`RankAllocator` keeps its state in flat tensors over every entry of every ``P``,
``lam``, ``Q`` (or LoRA ``B``, ``A`` for prune-LoRA), so one optimizer step costs a handful
of whole-tensor ops whatever the number of adapted matrices:

- sensitivity ``I = |w * grad|`` for all entries at once (Eq. 8), written in place into
  the flat buffer through per-parameter views, then the EMAs (Eqs. 9-10) with a reused
  scratch buffer: no full-size tensor is allocated per step;
- entry scores are summed per (triplet, part) with one ``index_add_`` over a precomputed
  entry -> slot index, giving the triplet score of Eq. 7;
- a persistent flat 0/1 mask over all triplets, with precomputed views onto it, zeroes the
  pruned ``lam`` (or ``B`` columns and ``A`` rows) in one ``torch._foreach_mul_``.

The state lives on the parameters' device and follows them if the model is moved later.

Sharded across processes (FSDP, ``engine/sharding.py``), each process holds some rows of
every ``P``, ``lam`` and ``Q``: :meth:`RankAllocator.place` gives the allocator a
:class:`Placement` that says which, and from then on the sensitivity and uncertainty
averages are kept only for the entries this process holds, the per-(triplet, part) sums
of Eq. 7 are added up over the processes (identically on every one), and the top-b(t)
is taken from those sums: the mask every process computes is the one-process mask.
Without a placement nothing of this costs anything (:data:`WHOLE`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from ..config import AdaLoRAConfig, ConfigError
from .placement import WHOLE, Placement

Score = Literal["smoothed", "sensitivity", "magnitude"]
# Slot parts: triplet i owns slots 3i (P column / B column), 3i+1 (lam), 3i+2 (Q row / A row).
_LEFT, _LAM, _RIGHT = 0, 1, 2


def budget_schedule(t: int, b0: int, bT: int, t_init: int, t_final: int, T: int) -> int:
    """b(t), the number of unmasked singular values after step t (Eq. (12) corrected;
    docs/maths.md#budget-schedule).

    ``floor(bT + (b0 - bT) * (1 - (t - t_init) / (T - t_init - t_final)) ** 3)`` in the middle
    phase, computed in exact integer arithmetic so the floor never slips on a rounding error.
    """
    if t <= t_init:
        return b0
    if t > T - t_final:
        return bT
    span = T - t_init - t_final
    left = T - t_final - t  # span * (1 - (t - t_init) / span)
    return bT + ((b0 - bT) * left**3) // span**3


def check_schedule(b0: int, bT: int, t_init: int, t_final: int, T: int | None) -> None:
    """Reject a pruning schedule that cannot run, before any training step
    (docs/maths.md#budget-schedule). ``T=None`` (a dry run, which reads no data and so does
    not know T) checks everything that does not depend on T."""
    if bT < 1:
        raise ConfigError(f"adalora.budget must be >= 1 when pruning, got {bT}")
    if bT > b0:
        raise ConfigError(
            f"adalora.budget={bT} exceeds the initial budget b0={b0} (adapted matrices x "
            "initial rank); lower adalora.budget or raise the initial rank"
        )
    if t_final < 1:
        # Without a final phase the last mask event may fall before T (T % delta_t != 0),
        # leaving a pattern above b(T); one frozen step guarantees the pattern is at b(T).
        raise ConfigError(f"adalora.t_final must be >= 1 when pruning, got {t_final}; the "
                          "final phase fixes the rank pattern at adalora.budget")
    if T is not None and t_init + t_final >= T:
        raise ConfigError(
            f"rank schedule does not fit: adalora.t_init={t_init} + adalora.t_final={t_final} "
            f"= {t_init + t_final} >= T={T} optimizer steps; shorten them, or train longer: "
            f"set train.max_steps above {t_init + t_final} (T then no longer depends on the "
            "data size), or more train.epochs"
        )


@dataclass(frozen=True)
class StepReport:
    """What the allocator did at one optimizer step (a method's ``after_step`` result)."""

    budget: int
    """b(t), the total rank budget at this step (docs/maths.md#budget-schedule)."""
    ranks: dict[str, int] | None = None
    """Every adapted matrix's rank, when this step changed the mask (a mask event)."""


class RankAllocator:
    """Scores triplets with the step's gradients and masks all but the global top-b(t)."""

    def __init__(self, layers: Sequence[tuple[str, nn.Module]], *, budget: int,
                 total_steps: int, t_init: int, t_final: int, delta_t: int,
                 beta1: float = 0.85, beta2: float = 0.85, score: Score = "smoothed"):
        if score not in ("smoothed", "sensitivity", "magnitude"):
            raise ConfigError(f"unknown importance score {score!r}")
        self.paths = [path for path, _ in layers]
        self.bT, self.T = budget, total_steps
        self.t_init, self.t_final, self.delta_t = t_init, t_final, delta_t
        self.beta1, self.beta2, self.score = beta1, beta2, score
        self._layers = [layer for _, layer in layers]
        self.placement = WHOLE
        self._collect()
        self._index()
        self.mask = torch.ones(self.b0, device=self.slot.device, dtype=torch.float32)  # 1 = kept
        self.frozen = False  # True once the final-phase pattern is fixed
        self.agree: Callable[[torch.Tensor], torch.Tensor] | None = None
        """Makes a newly chosen keep-mask the same on every process of a distributed run
        (the engine sets it: rank 0's choice, broadcast); None on one process. Under FSDP
        every process sums the same per-shard scores, and rank 0's choice still decides."""
        self._averages()

    def _averages(self) -> None:
        """Zeroed score state over the entries this process holds, and the views onto it."""
        n_entries = self.slot.numel()
        kw = {"device": self.slot.device, "dtype": torch.float32}
        self.I = torch.zeros(n_entries, **kw)  # latest sensitivity, Eq. 8
        self.I_bar = torch.zeros(n_entries, **kw)  # Eq. 9, starts at 0, no bias correction
        self.U_bar = torch.zeros(n_entries, **kw)  # Eq. 10
        self._views = self._mask_views()
        self._I_views, self._scratch = self._score_buffers()

    def place(self, placement: Placement) -> None:
        """Score and mask only this process's rows of each parameter from now on (the model
        was just sharded). Called before the first step; the mask and frozen flag stay."""
        self.placement = placement
        self._collect()
        self._index()
        device = self.slot.device  # a model built on the meta device was made real since
        self.mask = (torch.ones(self.b0, device=device) if self.mask.is_meta
                     else self.mask.to(device))
        self._averages()

    @classmethod
    def from_config(cls, layers: Sequence[tuple[str, nn.Module]], cfg: AdaLoRAConfig,
                    total_steps: int) -> RankAllocator:
        return cls(layers, budget=cfg.budget, total_steps=total_steps, t_init=cfg.t_init,
                   t_final=cfg.t_final, delta_t=cfg.delta_t, beta1=cfg.beta1,
                   beta2=cfg.beta2, score=cfg.score)

    # ------------------------------------------------------------------ construction

    def _collect(self) -> None:
        """References to the scored parameters and to the tensors the mask multiplies."""
        self.params: list[nn.Parameter] = []
        self._targets: list[tuple[torch.Tensor, str, int, int]] = []  # (tensor, how, off, r)
        offset = 0
        for layer in self._layers:
            left, lam, right = layer.triplet_factors()  # (d_out, r), (r,) | None, (r, d_in)
            r = left.shape[1]
            if lam is not None:
                self.params += [left, lam, right]
                self._targets.append((lam, "lam", offset, r))
            else:  # prune-LoRA zeroes the whole doublet
                self.params += [left, right]
                self._targets += [(left, "cols", offset, r), (right, "rows", offset, r)]
            offset += r

    def _index(self) -> None:
        """The entry -> (triplet, part) slot index over the flat entries (built once)."""
        slots, counts, layer_of, entries = [], [], [], []
        offset, start, rows = 0, 0, self.placement.rows
        for k, layer in enumerate(self._layers):
            left, lam, right = layer.triplet_factors()
            (d_out, r), d_in = left.shape, right.shape[1]
            slot = 3 * torch.arange(offset, offset + r)  # (r,)
            lo, hi = rows(left)  # row-major (j, i) -> column i, for the rows j held here
            slots.append((slot + _LEFT).repeat(hi - lo))
            entries.append(torch.arange(start + lo * r, start + hi * r))
            start += d_out * r
            if lam is not None:
                lo, hi = rows(lam)
                slots.append(slot[lo:hi] + _LAM)
                entries.append(torch.arange(start + lo, start + hi))
                start += r
            lo, hi = rows(right)  # row-major (i, j) -> row i
            slots.append((slot[lo:hi] + _RIGHT).repeat_interleave(d_in))
            entries.append(torch.arange(start + lo * d_in, start + hi * d_in))
            start += r * d_in
            counts.append(torch.tensor([[d_out, int(lam is not None), d_in]] * r))
            layer_of.append(torch.full((r,), k))
            offset += r
        device = self.params[0].device
        self.b0 = offset
        self.slot = torch.cat(slots).to(device)  # (n_entries,), in the order of self.params
        # where each entry held here sits among all entries (None: all are held here)
        self._entries = None if self.placement is WHOLE else torch.cat(entries).to(device)
        self.n_total = start  # entries over all processes
        count = torch.cat(counts).to(device, torch.float32)  # (n_triplets, 3)
        self.has_lam = count[:, _LAM] > 0  # (n_triplets,)
        self.cost = count.sum(dim=1)  # d_out + d_in (+ 1): parameters per triplet
        self.slot_count = count.clamp(min=1)  # divisor for the means of Eq. 7
        self.layer_of = torch.cat(layer_of).to(device)  # (n_triplets,)

    def _mask_views(self) -> list[torch.Tensor]:
        """Views of ``self.mask`` shaped like each masked tensor (no copies)."""
        views = []
        for tensor, how, off, r in self._targets:
            lo, hi = self.placement.rows(tensor)  # the rows of lam / B / A held here
            if how == "cols":
                m = self.mask[off:off + r].view(1, r).expand(hi - lo, r)  # (d_out, r)
            elif how == "rows":
                m = self.mask[off + lo:off + hi].view(-1, 1).expand(hi - lo, tensor.shape[1])
            else:
                m = self.mask[off + lo:off + hi]  # (r,)
            views.append(m)
        return views

    def _score_buffers(self) -> tuple[list[torch.Tensor] | None, torch.Tensor]:
        """Views of ``self.I`` shaped like each scored parameter, so ``w * grad`` is written
        straight into the flat buffer (no per-step product tensors and concatenation), and
        a scratch buffer for ``|I - I_bar|``. Views only when every parameter is fp32:
        otherwise the product is taken in the parameter's dtype first, as before."""
        scratch = torch.empty_like(self.I)
        if any(p.dtype != torch.float32 for p in self.params):
            return None, scratch
        views, offset = [], 0
        for p in map(self.placement.local, self.params):
            views.append(self.I[offset:offset + p.numel()].view(p.shape))
            offset += p.numel()
        return views, scratch

    def _sync_device(self) -> None:
        """Follow the parameters if the model was moved (or they were replaced) since."""
        stale = self.params[0] is not self._layers[0].triplet_factors()[0]
        if stale:
            self._collect()
        device = self.params[0].device
        if self.slot.device != device:
            stale = True
            for name in ("I", "I_bar", "U_bar", "mask", "slot", "has_lam", "cost",
                         "slot_count", "layer_of", "_entries"):
                if getattr(self, name) is not None:
                    setattr(self, name, getattr(self, name).to(device))
        if stale:
            self._views = self._mask_views()
            self._I_views, self._scratch = self._score_buffers()

    # ------------------------------------------------------------------ scores

    def _update_scores(self) -> None:
        local = self.placement.local
        params = [local(p) for p in self.params]
        # A parameter unused in forward has no grad: its sensitivity is 0.
        grads = [local(p.grad) if p.grad is not None else torch.zeros_like(w)
                 for p, w in zip(self.params, params)]
        if self._I_views is not None:  # fp32: w * grad in place in the flat buffer
            torch._foreach_copy_(self._I_views, params)
            torch._foreach_mul_(self._I_views, grads)
            self.I.abs_()  # Eq. 8
        else:
            prods = torch._foreach_mul(params, grads)
            self.I.copy_(torch.cat([x.reshape(-1) for x in prods]).float().abs_())  # Eq. 8
        # A step the fp16 loss scaler skipped never gets here (scored=False). Without loss
        # scaling a non-finite gradient is still possible under a finite loss: such an entry
        # carries no information this step, and one inf would otherwise stay in its EMA.
        self.I.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
        self.I_bar.mul_(self.beta1).add_(self.I, alpha=1 - self.beta1)  # Eq. 9
        # Eq. 10 uses the I_bar just updated, as the authors' code does.
        diff = torch.sub(self.I, self.I_bar, out=self._scratch).abs_()
        self.U_bar.mul_(self.beta2).add_(diff, alpha=1 - self.beta2)

    def _segment_sum(self, x: torch.Tensor) -> torch.Tensor:
        """Sum entry values per (triplet, part) over every process: ``(n_triplets, 3)``."""
        out = torch.zeros(3 * self.b0, device=x.device, dtype=torch.float32)
        return self.placement.total(out.index_add_(0, self.slot, x)).view(self.b0, 3)

    def scores(self) -> torch.Tensor:
        """Triplet importance ``S`` of shape ``(n_triplets,)`` under the configured variant."""
        if self.score == "magnitude":  # Table 5: |lam|, or ||B[:, i]|| ||A[i, :]|| for LoRA
            w2 = torch.cat([self.placement.local(p).detach().reshape(-1)
                            for p in self.params]).float().pow_(2)
            norms = self._segment_sum(w2).sqrt_()  # (n_triplets, 3)
            return torch.where(self.has_lam, norms[:, _LAM], norms[:, _LEFT] * norms[:, _RIGHT])
        s = self.I if self.score == "sensitivity" else self.I_bar * self.U_bar  # Eq. 11
        return (self._segment_sum(s) / self.slot_count).sum(dim=1)  # Eq. 7: s(lam) + means

    # ------------------------------------------------------------------ masking

    def _select(self, b: int) -> None:
        """Keep exactly the b highest-scoring triplets over all matrices (Eq. 5)."""
        S = torch.nan_to_num(self.scores(), nan=float("-inf"))  # a NaN never outranks a score
        # Stable sort: among equal scores the lower global index wins, deterministically.
        order = torch.argsort(S, descending=True, stable=True)
        keep = torch.zeros_like(self.mask)
        keep[order[:b]] = 1.0
        if self.agree is not None:  # ranks' scores may differ in their last bits
            keep = self.agree(keep)
        self.mask.copy_(keep)  # in place, so the precomputed views stay valid

    def _apply_mask(self) -> None:
        torch._foreach_mul_([self.placement.local(t) for t, *_ in self._targets], self._views)

    @torch.no_grad()
    def step(self, t: int, scored: bool = True, grad_scale: float = 1.0) -> StepReport:
        """Call after ``optimizer.step()`` and before ``zero_grad()`` with step t (from 1).

        ``scored=False``: the loss scaler skipped this step (its gradients are not finite),
        so the importance averages are left exactly as they were (docs/maths.md#masking);
        ``t`` still counts it, and a mask event due at ``t`` uses the averages so far.
        ``grad_scale`` plays no part: Eq. 8 reads the parameters' gradients, which the
        loss scaler has unscaled already."""
        self._sync_device()
        b_t = budget_schedule(t, self.b0, self.bT, self.t_init, self.t_final, self.T)
        ranks = None
        last_scored = self.T - self.t_final
        if scored and t <= last_scored:  # also during warm-up, as the authors' code does
            self._update_scores()
        if t > last_scored:  # final phase: pattern fixed at bT, re-applied every step
            if not self.frozen:
                self._select(self.bT)
                self.frozen = True
                ranks = self.rank_pattern()
            self._apply_mask()
        elif t > self.t_init and t % self.delta_t == 0:
            self._select(b_t)
            self._apply_mask()
            ranks = self.rank_pattern()
        return StepReport(b_t, ranks)

    # ------------------------------------------------------------------ reporting, resume

    def rank_pattern(self) -> dict[str, int]:
        """Rank of every adapted matrix: its number of unmasked triplets."""
        ranks = torch.zeros(len(self.paths), device=self.mask.device)
        ranks.index_add_(0, self.layer_of, self.mask)
        return dict(zip(self.paths, (int(r) for r in ranks.tolist())))

    def final_adapter_params(self) -> int:
        """Parameters in the kept triplets: ``d_in + d_out + 1`` each (no 1 for LoRA)."""
        return int((self.mask * self.cost).sum().item())

    def _whole(self, x: torch.Tensor) -> torch.Tensor:
        """An average over the entries held here, as the one over all entries (sharded: put
        in place among zeros and added up over the processes, which is exact)."""
        if self._entries is None:
            return x.clone()
        every = torch.zeros(self.n_total, device=x.device, dtype=x.dtype)
        return self.placement.total(every.index_copy_(0, self._entries, x))

    def state_dict(self) -> dict[str, Any]:
        """The same whole state however the model is sharded (every process must call it
        when it is), so a run resumes on any number of processes."""
        return {"I": self._whole(self.I), "I_bar": self._whole(self.I_bar),
                "U_bar": self._whole(self.U_bar), "mask": self.mask.clone(),
                "frozen": self.frozen, "paths": list(self.paths)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if list(state["paths"]) != self.paths or state["mask"].shape != self.mask.shape:
            raise ValueError("allocator state was saved for different adapted matrices")
        self._sync_device()
        for name in ("I", "I_bar", "U_bar"):
            saved = state[name].to(self.I.device)
            getattr(self, name).copy_(saved if self._entries is None else saved[self._entries])
        self.mask.copy_(state["mask"])
        self.frozen = bool(state["frozen"])
