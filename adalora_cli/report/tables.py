"""``adalora report``: finished runs -> the paper's tables, with statistics.

A row is a method at one size (its budget level and matched r0 / r / d), its "# Params"
the adapter parameters as the paper counts them (AdaLoRA: the parameters left after
pruning, ``final_adapter_params``; the others: ``adapter_params``). A cell is the mean
over seeds with the sample standard deviation (ddof = 1) and the number of seeds. Each
method is compared with LoRA at the same budget level by a two-sided Welch t-test across
seeds. Reading runs lives in :mod:`adalora_cli.report.runs`, rendering in
:mod:`adalora_cli.report.render`, figures in :mod:`adalora_cli.report.figures`.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from .paper import ALL_AVE, TRAINING_COST, published
from .runs import TASKS, Column, Run, load_runs

FAMILIES = {"glue": "GLUE (paper Table 1)", "squad": "SQuAD (paper Table 2)",
            "summarization": "Summarization (paper Table 3)", "other": "Other tasks"}
METHOD_NAMES = {"full": "Full FT", "bitfit": "BitFit", "houlsby": "HAdapter",
                "pfeiffer": "PAdapter", "lora": "LoRA", "adalora": "AdaLoRA"}
_METHOD_ORDER = ["full", "bitfit", "houlsby", "pfeiffer", "lora", "adalora"]


# --------------------------------------------------------------------------- aggregation


@dataclass
class Cell:
    values: list[float]

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def std(self) -> float | None:
        """Sample standard deviation (ddof = 1); None for a single seed."""
        return statistics.stdev(self.values) if self.n > 1 else None


@dataclass
class Row:
    method: str
    budget_level: int | None
    size: str
    runs: list[Run] = field(default_factory=list)
    cells: dict[str, Cell] = field(default_factory=dict)
    all_ave: float | None = None

    @property
    def label(self) -> str:
        name = METHOD_NAMES.get(self.method, self.method)
        # the paper names LoRA by its rank; any other size shows only without a level
        shown = self.size and (self.method == "lora" or self.budget_level is None)
        return f"{name} {self.size}" if shown else name

    @property
    def params(self) -> float:
        return statistics.fmean(r.params for r in self.runs)

    def paper(self, column: str) -> float | None:
        return published(column, self.method, self.budget_level)


@dataclass
class Table:
    family: str
    title: str
    columns: list[Column]
    rows: list[Row]
    has_all_ave: bool
    paper_all_ave: bool
    """The table holds all eight GLUE tasks, so the paper's All Ave. is comparable."""

    def best(self, key: str) -> float | None:
        """The highest mean of a column (every metric here is higher-is-better)."""
        values = [r.all_ave if key == ALL_AVE else (r.cells[key].mean if key in r.cells else None)
                  for r in self.rows]
        values = [v for v in values if v is not None]
        return max(values) if values else None


def _row_order(row: Row) -> tuple:
    method = _METHOD_ORDER.index(row.method) if row.method in _METHOD_ORDER else 99
    level = row.budget_level
    return (level is not None, -(level or 0), method, row.method, row.size)


def build_tables(runs: list[Run]) -> list[Table]:
    tables = []
    for family, title in FAMILIES.items():
        mine = [r for r in runs if TASKS.get(r.task, ("", "other"))[1] == family]
        if not mine:
            continue
        task_order = list(TASKS) + sorted({r.task for r in mine} - set(TASKS))
        columns: dict[str, Column] = {}
        for task in task_order:
            for run in (r for r in mine if r.task == task):
                for key in run.values:
                    columns.setdefault(key, _column(key))
        cols = sorted(columns.values(), key=lambda c: (task_order.index(c.task),
                                                       _label_order(c)))
        rows: dict[tuple, Row] = {}
        for run in mine:
            row = rows.setdefault((run.method, run.budget_level, run.size),
                                  Row(run.method, run.budget_level, run.size))
            row.runs.append(run)
            for key, value in run.values.items():
                row.cells.setdefault(key, Cell([])).values.append(value)
        tasks = list(dict.fromkeys(c.task for c in cols))
        has_ave = family == "glue" and len(tasks) > 1
        for row in rows.values():
            row.all_ave = _all_average(row, cols, tasks) if has_ave else None
        tables.append(Table(family, title, cols, sorted(rows.values(), key=_row_order),
                            has_ave, has_ave and len(tasks) == 8))
    return tables


def _column(key: str) -> Column:
    task, _, label = key.partition(":")
    return Column(key, task, TASKS[task][0] if task in TASKS else task, label)


def _label_order(col: Column) -> int:
    specs = TASKS.get(col.task, ("", "", []))[2]
    labels = [s[0] for s in specs]
    return labels.index(col.label) if col.label in labels else len(labels)


def _all_average(row: Row, cols: list[Column], tasks: list[str]) -> float | None:
    """Table 1's All Ave.: the mean over tasks of each task's score, a task with two
    numbers (MNLI m/mm, QQP Acc/F1) scoring their mean. This reproduces the paper's
    column to within its rounding (checked in tests against all twelve rows)."""
    scores = []
    for task in tasks:
        cells = [row.cells.get(c.key) for c in cols if c.task == task]
        if any(cell is None for cell in cells):
            return None  # an average over fewer tasks would not compare with the others
        scores.append(statistics.fmean(cell.mean for cell in cells))
    return statistics.fmean(scores)


# --------------------------------------------------------------------------- statistics


def welch_p(a: list[float], b: list[float]) -> float | None:
    """Two-sided Welch t-test p-value (unequal variances); None with < 2 seeds a side.

    Written out (t, Welch-Satterthwaite df) so the tests can check it against scipy."""
    from scipy.stats import t as student_t

    if len(a) < 2 or len(b) < 2:
        return None
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    diff = statistics.fmean(a) - statistics.fmean(b)
    if va + vb == 0:  # no spread on either side: scipy's convention
        return math.nan if diff == 0 else 0.0
    t = diff / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return float(2 * student_t.sf(abs(t), df))


@dataclass
class Comparison:
    table: Table
    row: Row
    baseline: Row
    column: str
    diff: float
    p: float | None


def compare_to_lora(tables: list[Table]) -> list[Comparison]:
    """Each method against LoRA at the same budget level, per column."""
    out = []
    for table in tables:
        loras = {r.budget_level: r for r in reversed(table.rows) if r.method == "lora"}
        for row in table.rows:
            base = loras.get(row.budget_level)
            if row.method == "lora" or base is None:
                continue
            for col in table.columns:
                a, b = row.cells.get(col.key), base.cells.get(col.key)
                if a and b:
                    out.append(Comparison(table, row, base, col.key, a.mean - b.mean,
                                          welch_p(a.values, b.values)))
    return out


@dataclass
class CostRow:
    """Table 9: peak memory and time per epoch, mean over the runs of one configuration."""

    task: str
    row: Row
    memory_gib: float | None
    seconds_per_epoch: float | None
    device: str
    paper: tuple[float, float] | None


def training_cost(runs: list[Run]) -> list[CostRow]:
    groups: dict[tuple, Row] = {}
    for run in runs:
        groups.setdefault((run.task, run.method, run.budget_level, run.size),
                          Row(run.method, run.budget_level, run.size)).runs.append(run)
    out = []
    for (task, *_), row in sorted(groups.items(), key=lambda kv: (kv[0][0], _row_order(kv[1]))):
        mem = [r.peak_memory_bytes / 2**30 for r in row.runs if r.peak_memory_bytes]
        per_epoch = [r.train_seconds / r.epochs for r in row.runs if r.train_seconds is not None
                     and r.epochs]
        out.append(CostRow(task, row, statistics.fmean(mem) if mem else None,
                           statistics.fmean(per_epoch) if per_epoch else None,
                           "/".join(sorted({r.device for r in row.runs if r.device})),
                           TRAINING_COST.get((task, row.budget_level, row.method))))
    return out


@dataclass
class Report:
    tables: list[Table]
    comparisons: list[Comparison]
    cost: list[CostRow]
    runs: list[Run]
    skipped: list[tuple[Path, str]]
    duplicates: list[str]
    show_paper: bool = False


def _duplicate_seeds(tables: list[Table]) -> list[str]:
    notes = []
    for table in tables:
        for row in table.rows:
            seen: dict[tuple, list[Path]] = {}
            for run in row.runs:
                seen.setdefault((run.task, run.seed), []).append(run.path)
            notes += [f"{row.label} ({row.budget_level}) {task} seed {seed} comes from "
                      f"{len(paths)} runs ({', '.join(map(str, paths))}); all are counted"
                      for (task, seed), paths in seen.items() if len(paths) > 1]
    return notes


def build_report(paths: list[Path], show_paper: bool = False,
                 eval_name: str | None = None) -> Report:
    runs, skipped = load_runs(paths, eval_name)
    tables = build_tables(runs)
    return Report(tables, compare_to_lora(tables), training_cost(runs), runs, skipped,
                  _duplicate_seeds(tables), show_paper)
