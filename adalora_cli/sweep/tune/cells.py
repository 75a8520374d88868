"""What a tune runs: one cell per (config, method, budget level) of its manifest, each with
its search space and tuning metric; a cell's trials and, once chosen, its seed runs, all as
the sweep planner's :class:`~adalora_cli.sweep.plan.PlannedRun` so the sweep's launchers
start them as ordinary run directories.

Names inside the sweep directory: trials ``<config>-<method>-b<level>-t<NNN>`` (trained on
the manifest's first seed), seed runs ``<config>-<method>-b<level>-tuned-s<seed>``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...config import ConfigError, RunConfig, load_config
from ...tasks.columns import LOWER_IS_BETTER, task_report
from ..plan import Group, PlannedRun, SweepSpec, plan
from .manifest import TuneSpec
from .space import Space, check_key, override


@dataclass(frozen=True)
class Cell:
    name: str
    """``<config>-<method>-b<level>`` (and the group's tag): the study's name too."""
    method: str
    budget_level: int | None
    base: PlannedRun
    """The cell's run at the tuning seed, before any searched value."""
    group: Group
    spaces: tuple[Space, ...]
    metric: str
    """``split/metric`` the study scores."""
    lower_is_better: bool
    holdout: int | None = None
    """Training rows its trials hold out (None: chosen on the validation split)."""

    def trial(self, spec: TuneSpec, number: int, params: dict[str, Any],
              record: Path) -> PlannedRun:
        """Trial ``number`` with ``params`` (a searched value per key), reporting to the
        study whose record is ``record``."""
        extra = [override(k, v) for k, v in params.items()]
        if self.holdout is not None:
            extra.append(f"task.holdout={self.holdout}")
        extra += [f"tune.study={record.resolve()}", f"tune.trial={number}",
                  f"tune.metric={self.metric}"]
        overrides = (*self.base.overrides, *extra)
        load_config(self.base.config, list(overrides))  # valid before it is launched
        return PlannedRun(f"{self.name}-t{number:03d}", self.base.config, self.method,
                          self.budget_level, self.base.seed, overrides, self.base.size)

    def seed_runs(self, spec: TuneSpec, params: dict[str, Any]) -> list[PlannedRun]:
        """The chosen ``params`` on every seed of the manifest: ordinary sweep runs."""
        g = self.group
        tag = f"{g.tag}-tuned" if g.tag else "tuned"
        group = Group([self.base.config], [self.method],
                      [self.budget_level] if self.budget_level is not None else None,
                      spec.seeds, [*g.overrides, *(override(k, v) for k, v in params.items())],
                      tag)
        return plan(SweepSpec(spec.name, [group], spec.source))


def _metric(cfg: RunConfig, spec: TuneSpec, where: str) -> tuple[str, bool]:
    """``split/metric`` the cell is scored on, and whether lower is better."""
    report = task_report(cfg.task.name, {})
    column = next((c for c in report.columns if spec.metric in (None, c.metric)), None)
    metric = spec.metric or (column.metric if column else None)
    if metric is None:
        raise ConfigError(f"{where}: task {cfg.task.name} names its metrics only once it "
                          "has scored; name the tuning metric with metric: (e.g. accuracy)")
    split = "heldout" if spec.select_on == "heldout" else (
        column.splits[0] if column and column.splits else "validation")
    lower = (bool(column.lower_is_better) if column and column.lower_is_better is not None
             else metric in LOWER_IS_BETTER)
    return f"{split}/{metric}", lower


def plan_cells(spec: TuneSpec) -> list[Cell]:
    """Every cell of the manifest, each config valid and each searched key one its method
    reads; a grid needs every key's values."""
    cells: list[Cell] = []
    n_cache: dict = {}
    for i, tg in enumerate(spec.groups):
        where = f"{spec.source}: runs[{i}]"
        group = tg.group
        at_seed = Group(group.configs, group.methods, group.budgets, [spec.tuning_seed],
                        group.overrides, group.tag)
        for run in plan(SweepSpec(spec.name, [at_seed], spec.source), n_cache):
            cfg = load_config(run.config, list(run.overrides))
            for space in tg.search:
                check_key(space, run.method, cfg, where)
            metric, lower = _metric(cfg, spec, where)
            name = run.name.rsplit("-s", 1)[0]
            if any(c.name == name for c in cells):
                raise ConfigError(f"{where}: cell {name} is tuned twice; give one of the "
                                  "groups a tag:")
            cells.append(Cell(name, run.method, run.budget_level, run, group, tg.search,
                              metric, lower, tg.holdout))
    return cells


def check_holdout(spec: TuneSpec, cells: list[Cell]) -> None:
    """``holdout:`` must leave training rows: each config's training split is read once
    (the task refuses a held-out slice as large as it, and tasks that cannot hold out)."""
    from ...tasks import get_task
    from ...tasks.data import carve_holdout

    seen: set[tuple] = set()
    for cell in cells:
        if cell.holdout is None:
            continue
        cfg = load_config(cell.base.config, [*cell.base.overrides,
                                              f"task.holdout={cell.holdout}"])
        key = (cfg.task.name, cfg.task.data_dir, str(cfg.task.data_files), cfg.task.dataset,
               cell.holdout)
        if key in seen:
            continue
        seen.add(key)
        task = get_task(cfg)
        raw = task.load_raw()
        carve_holdout(raw, cell.holdout, f"the training split of {cell.base.config}")
