"""``adalora train --dry-run`` and the sweep's plan: a run's model and method built on the meta
device from ``config.json`` alone, counted, and nothing trained.

Only shapes are needed to count parameters, so every weight load is intercepted
(``weightless.py``) and the task builds its model exactly as it does for training
(the right head, a warm start): a 7B-shaped config costs seconds and no memory.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from ..config import RunConfig
from ..methods import apply_method, parameter_table
from ..methods.budget_params import budget_info
from ..methods.registry import check_method
from ..tasks import get_task
from . import quantize
from .build import load_model, resolve_resources
from .weightless import weightless_loading


@dataclass(frozen=True)
class ModuleRow:
    """One adapter module of the dry run's table."""

    module: str
    kind: str
    adapter_params: int
    trainable: int


@dataclass(frozen=True)
class FinalBudget:
    """A pruning method (AdaLoRA, prune-LoRA): what trains at r0 and what b(T) keeps
    (``methods/budget_params.py``)."""

    adapter_params_at_r0: int
    final_budget: int
    """b(T)."""
    final_params_min: int
    final_params_max: int
    final_params_uniform: int | None
    """When every matrix can end at rank b(T) / n, the parameters that would keep."""
    final_mean_rank: float
    """b(T) / n: the mean final rank of an adapted matrix (docs/maths.md#budget-levels)."""


@dataclass(frozen=True)
class DryRun:
    """What ``adalora train --dry-run`` found: the per-module table and the totals."""

    adapter_params: int
    """The paper's # Params at the method's initial size."""
    head_params: int
    n_matrices: int
    trainable_params: int
    total_params: int
    method: str
    model: str
    table: list[ModuleRow] = field(default_factory=list)
    budget: FinalBudget | None = None
    ranks_at_start: bool = False
    """The method chooses each matrix's rank in a pass over data before training (EVA,
    GoRA): the counts are at its mean rank, and what trains may differ."""

    def info(self) -> dict[str, Any]:
        """The totals as the command's last, machine-readable line prints them."""
        out = {k: v for k, v in asdict(self).items() if k not in ("table", "budget")}
        return out | (asdict(self.budget) if self.budget else {})


def dry_run(cfg: RunConfig) -> DryRun:
    """Build model and method on the meta device, train nothing; the per-module table plus
    the totals. Only ``config.json`` is read, so a 7B-shaped config takes seconds."""
    cfg = resolve_resources(cfg)
    spec = check_method(cfg)
    quantize.check(cfg, spec.trains_base, cfg.model.name_or_path)  # refused as a run is
    with weightless_loading():
        model, _ = load_model(get_task(cfg), cfg, torch.float32)
        handle = apply_method(model, cfg, None)
    cfg = cfg.with_final_budget(handle.n_matrices)  # adalora.target_rank -> its b(T)
    kept = budget_info(cfg, handle)  # AdaLoRA: what trains at r0 vs what b(T) keeps
    budget = None
    if kept:
        mean = round(kept["final_budget"] / handle.n_matrices, 4)
        budget = FinalBudget(**kept, final_mean_rank=mean)
    return DryRun(
        adapter_params=handle.adapter_params,
        head_params=handle.head_params,
        n_matrices=handle.n_matrices,
        trainable_params=handle.trainable_params,
        total_params=sum(p.numel() for p in model.parameters()),
        method=cfg.method.name,
        model=cfg.model.name_or_path,
        table=[ModuleRow(**row) for row in parameter_table(model)],
        budget=budget,
        ranks_at_start=spec.pass_batches is not None,
    )
