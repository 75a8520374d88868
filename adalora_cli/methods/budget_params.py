"""How many adapter parameters the final budget b(T) keeps, before training decides where.

A triplet of matrix ``k`` costs ``d_out + d_in + 1`` parameters (``P[:, i]``, ``Q[i, :]``,
``lam[i]``; no ``+ 1`` for a pruned LoRA doublet). Training starts with ``r0`` triplets in
every matrix (what a dry run counts as trainable) and keeps ``b(T)`` of them, at most ``r0``
per matrix; which ones is learned, so before training the kept count is known exactly only
when every triplet costs the same. Otherwise it lies between the ``b(T)`` cheapest and the
``b(T)`` dearest choices that respect the ``r0`` cap, and the paper's "# Params" for a
uniform final rank ``b(T) / n`` (when that is a whole number) sits in between.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from ..config import RunConfig
from .allocator import check_schedule
from .base import MethodHandle
from .registry import method_spec


def triplet_costs(layers: Sequence[tuple[str, nn.Module]]) -> list[tuple[int, int]]:
    """``(parameters per triplet, r0)`` of every adapted matrix."""
    out = []
    for _, layer in layers:
        left, lam, right = layer.triplet_factors()  # (d_out, r), (r,) | None, (r, d_in)
        out.append((left.shape[0] + right.shape[1] + int(lam is not None), left.shape[1]))
    return out


def _greedy(costs: list[tuple[int, int]], budget: int, dearest: bool) -> int:
    total, left = 0, budget
    for cost, r0 in sorted(costs, reverse=dearest):
        take = min(r0, left)
        total += take * cost
        left -= take
    return total


def final_budget_params(costs: list[tuple[int, int]], budget: int) -> dict[str, int | None]:
    """Parameters at r0, and what b(T) keeps: its minimum, maximum and uniform-rank value."""
    n = len(costs)
    uniform = None
    if n and budget % n == 0 and all(budget // n <= r0 for _, r0 in costs):
        uniform = sum(cost * (budget // n) for cost, _ in costs)
    return {
        "adapter_params_at_r0": sum(cost * r0 for cost, r0 in costs),
        "final_budget": budget,
        "final_params_min": _greedy(costs, budget, dearest=False),
        "final_params_max": _greedy(costs, budget, dearest=True),
        "final_params_uniform": uniform,
    }


def budget_info(cfg: RunConfig, handle: MethodHandle) -> dict[str, Any]:
    """For a pruning method (AdaLoRA, prune-LoRA): the parameters b(T) keeps (dry run)."""
    if not method_spec(cfg.method.name).prunes(cfg):
        return {}
    costs, a = triplet_costs(handle.layers), cfg.adalora
    # A dry run reads no data, so T is unknown: check the rest of the schedule as a run would.
    check_schedule(sum(r0 for _, r0 in costs), a.budget, a.t_init, a.t_final, None)
    return final_budget_params(costs, a.budget)
