"""IncreLoRA's growth plan: when ranks grow, by how much, and how much room that needs
(docs/maths.md#increlora). Pure arithmetic, checked before anything is built.

Growth events fall at the steps ``t`` with ``t_init < t <= T - t_final`` and
``t % delta_t == 0`` (the schedule AdaLoRA masks on, unless ``increlora`` sets its own). At
each event the ``top_h`` most important matrices gain ``add_rank`` ranks, until the total
rank goes from ``n * init_rank`` to the budget b(T). A plan that cannot reach b(T) by the
last event is refused with the numbers, as an impossible pruning schedule is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from ..config import ConfigError, RunConfig
from .registry import round_half_up


@dataclass(frozen=True)
class GrowthPlan:
    budget: int
    """b(T): the total rank once growth ends."""
    init_rank: int
    add_rank: int
    top_h: int
    """Matrices chosen per growth event."""
    reserve: bool
    t_init: int
    delta_t: int
    t_final: int
    total_steps: int | None
    """T; None in a dry run (nothing grows)."""
    rounds: int
    """Growth events that add ranks: the most times one matrix can be chosen."""

    @property
    def capacity(self) -> int:
        """Triplets allocated per matrix: its start, every round it could win, and the
        reserves drawn behind them."""
        return self.init_rank + self.add_rank * (self.rounds + int(self.reserve))

    def is_event(self, t: int) -> bool:
        T = self.total_steps
        return (T is not None and self.t_init < t <= T - self.t_final
                and t % self.delta_t == 0)


def events_between(t_init: int, t_final: int, delta_t: int, T: int) -> int:
    """Number of steps ``t`` with ``t_init < t <= T - t_final`` and ``t % delta_t == 0``."""
    return max(0, (T - t_final) // delta_t - t_init // delta_t)


def plan_growth(cfg: RunConfig, n: int, total_steps: int | None) -> GrowthPlan:
    """The growth plan of ``cfg.increlora`` over ``n`` matrices and T = ``total_steps``."""
    ic, a = cfg.increlora, cfg.adalora
    t_init = a.t_init if ic.t_init is None else ic.t_init
    delta_t = a.delta_t if ic.delta_t is None else ic.delta_t
    t_final = a.t_final if ic.t_final is None else ic.t_final
    start = n * ic.init_rank
    if ic.budget < start:
        raise ConfigError(f"increlora.budget={ic.budget} is below the starting total rank "
                          f"{start} ({n} matrices x increlora.init_rank={ic.init_rank}); "
                          "raise increlora.budget or lower increlora.init_rank")
    need = ic.budget - start
    add = ic.add_rank or max(1, round_half_up(Fraction(ic.budget, 2 * n)))
    top_h = min(n, ic.top_h) if ic.top_h is not None else 1
    rounds = 0
    if total_steps is not None and need > 0:
        events = events_between(t_init, t_final, delta_t, total_steps)
        where = (f"growth events every {delta_t} steps in ({t_init}, {total_steps - t_final}] "
                 f"(increlora.t_init / delta_t / t_final, or adalora's when unset)")
        if events == 0:
            raise ConfigError(f"IncreLoRA has no growth event: no {where}; shorten t_init "
                              "or t_final, or lower delta_t")
        if ic.top_h is None:  # the fewest matrices per event that reach b(T) in time
            top_h = math.ceil(need / (add * events))
            if top_h > n:
                raise ConfigError(
                    f"IncreLoRA cannot grow {need} ranks in {events} {where} even choosing "
                    f"all {n} matrices at each (increlora.add_rank={add}); raise "
                    "increlora.add_rank, add growth events or lower increlora.budget")
        rounds = math.ceil(need / (top_h * add))
        if rounds > events:
            raise ConfigError(
                f"IncreLoRA needs {rounds} growth events to grow {need} ranks "
                f"(increlora.top_h={top_h} x add_rank={add}) but has {events} {where}; "
                "raise increlora.top_h (or leave it unset), or add growth events")
    return GrowthPlan(ic.budget, ic.init_rank, add, top_h, ic.reserve, t_init, delta_t,
                      t_final, total_steps, rounds)
