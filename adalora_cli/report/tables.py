"""``adalora report``: finished runs -> the paper's tables, with statistics.

A row is a method at one size (its budget level and matched r0 / r / d), its "# Params"
the adapter parameters as the paper counts them (AdaLoRA: the parameters left after
pruning, ``final_adapter_params``; the others: ``adapter_params``). A cell is the mean
over seeds with the sample standard deviation (ddof = 1) and the number of seeds. Each
method is compared with one baseline method (LoRA unless ``--against`` names another, e.g.
AdaLoRA when new methods challenge it) at the same budget level by a two-sided Welch t-test
across seeds.

Only seeds of one experiment are pooled: runs whose configs differ in anything but the seed
and bookkeeping (their digests differ, see ``methods.registry.comparable_config``) are
separate rows, and the config keys that differ become columns (``lr``, ``steps``, ``model``
...). Two runs of one config and one seed are one seed: the newest is kept, with a note.

Reading runs lives in :mod:`adalora_cli.report.runs`, rendering in
:mod:`adalora_cli.report.render`, figures in :mod:`adalora_cli.report.figures`.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from ..methods.registry import METHODS
from ..tasks.columns import REPORTS
from .paper import ALL_AVE, TRAINING_COST, published
from .runs import Column, Run, load_runs, nested_runs
from .tuning import Tune, read_tunes

FAMILIES = {"glue": "GLUE (paper Table 1)", "squad": "SQuAD (paper Table 2)",
            "summarization": "Summarization (paper Table 3)", "other": "Other tasks"}
METHOD_NAMES = {name: spec.title for name, spec in METHODS.items()}
_METHOD_ORDER = list(METHODS)  # the registry lists methods in the paper's row order
SHORT_KEYS = {"train.learning_rate": "lr", "train.max_steps": "steps",
              "model.name_or_path": "model", "train.epochs": "epochs",
              "train.batch_size": "batch", "train.warmup_steps": "warmup",
              "train.grad_accum": "accum", "train.weight_decay": "wd",
              "train.precision": "precision"}
"""Column names of config keys that tell rows apart; any other key is shown by its full
dotted name."""
SIZE_KEYS = frozenset({key for spec in METHODS.values()
                       for key, _ in spec.size_keys + spec.unmatched_size_keys}
                      | {"adalora.target_rank"})
"""Keys a row's size already shows (in its name, or as b(T)): never a column of their own."""


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
    variant: tuple[tuple[str, str], ...] = ()
    """(column, value) of the config keys that set this row apart from others of its method
    and size; () when no run of that method and size differs."""
    runs: list[Run] = field(default_factory=list)
    cells: dict[str, Cell] = field(default_factory=dict)
    all_ave: float | None = None

    def shown(self, key: str) -> str:
        """This row's value of config key ``key``; values joined by '/' when its runs
        differ in it (runs of several tasks, each with its own learning rate)."""
        values = {show_value(r.config.get(key)) for r in self.runs}
        return "/".join(sorted(values, key=_sortable))

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
    differs: list[str] = field(default_factory=list)
    """Config keys shown as columns because rows differ in them (e.g. ['train.learning_rate'],
    headed by :func:`short_key`); empty when no two rows of one task differ but in method
    and size."""

    def best(self, key: str) -> float | None:
        """The best mean of a column: the highest, or the lowest for a loss or a perplexity
        (the task's columns say which, ``tasks/columns.py``)."""
        values = [r.all_ave if key == ALL_AVE else (r.cells[key].mean if key in r.cells else None)
                  for r in self.rows]
        values = [v for v in values if v is not None]
        if not values:
            return None
        return min(values) if self.lower_is_better(key) else max(values)

    def lower_is_better(self, key: str) -> bool:
        return any(c.key == key and c.lower_is_better for c in self.columns)


def _row_order(row: Row) -> tuple:
    method = _METHOD_ORDER.index(row.method) if row.method in _METHOD_ORDER else 99
    level = row.budget_level
    return (level is not None, -(level or 0), method, row.method, row.size,
            [(k, _sortable(v)) for k, v in row.variant])


def _sortable(text: str) -> tuple:
    try:
        return (0, float(text), text)
    except ValueError:
        return (1, 0.0, text)


def show_value(value: object) -> str:
    """A config value as a table cell: 0.0005, 40, tests/fixtures/tiny-bert, -."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return str(value)


def short_key(key: str) -> str:
    return SHORT_KEYS.get(key, key)


def dedupe_seeds(runs: list[Run]) -> tuple[list[Run], list[str]]:
    """One run per (experiment, seed): of runs sharing task, method, config digest and seed,
    the newest (by its summary's time) is kept, and a note names the others. A repeat of one
    seed is not a new sample, so averaging it in would shrink the spread falsely."""
    groups: dict[tuple, list[Run]] = {}
    for run in runs:  # the level and size too: rows are never pooled across them either
        key = (run.task, run.method, run.budget_level, run.size, run.digest, run.seed)
        groups.setdefault(key, []).append(run)
    kept, notes = [], []
    for (task, method, *_, seed), same in groups.items():
        same.sort(key=lambda r: (r.finished_at, str(r.path)))
        newest = same[-1]
        kept.append(newest)
        if len(same) > 1:
            name = METHOD_NAMES.get(method, method)
            level = f" ({newest.budget_level})" if newest.budget_level is not None else ""
            notes.append(f"{name} {newest.size}{level} {task} seed {seed} comes from "
                         f"{len(same)} runs of one config "
                         f"({', '.join(str(r.path) for r in same)}); kept only the newest, "
                         f"{newest.path}")
    kept_ids = {id(r) for r in kept}
    return [r for r in runs if id(r) in kept_ids], notes


def _key_order(key: str) -> tuple:
    known = list(SHORT_KEYS)
    return (key not in SHORT_KEYS, known.index(key) if key in SHORT_KEYS else 0, key)


def differing_keys(runs: list[Run]) -> list[str]:
    """Config keys in which runs of one task differ, among the keys all of them have (so a
    method's own section never counts; its size is in the row's name or b(T), so the keys
    that set it never do either). Runs of one row and
    task share their config, so these are what tell rows apart besides method and size,
    e.g. a learning rate tuned per method."""
    keys: set[str] = set()
    by_task: dict[str, list[Run]] = {}
    for run in runs:
        by_task.setdefault(run.task, []).append(run)
    for same_task in by_task.values():
        common = set.intersection(*(set(r.config) for r in same_task)) - {"method.name"}
        common -= SIZE_KEYS  # rows at two budget levels differ in them by construction
        keys |= {k for k in common
                 if len({show_value(r.config.get(k)) for r in same_task}) > 1}
    return sorted(keys, key=_key_order)


def assign_variants(runs: list[Run]) -> set[str]:
    """Set ``run.variant``: the config keys on which runs of one task, method and size
    differ, with this run's values; returns those keys. Runs of one method and size share
    their keys across tasks, so a row of the table never pools two configs, yet a learning
    rate tuned per task (the same within each task) splits nothing."""
    families: dict[tuple, list[Run]] = {}
    for run in runs:
        families.setdefault((run.method, run.budget_level, run.size), []).append(run)
    split: set[str] = set()
    for members in families.values():
        keys: set[str] = set()
        by_task: dict[str, dict[str, dict]] = {}
        for run in members:
            by_task.setdefault(run.task, {})[run.digest] = run.config
        for configs in by_task.values():
            if len(configs) > 1:
                found = list(configs.values())
                union = set().union(*found)
                keys |= {k for k in union if len({show_value(c.get(k)) for c in found}) > 1}
        ordered = sorted(keys, key=_key_order)
        for run in members:
            run.variant = tuple((short_key(k), show_value(run.config.get(k))) for k in ordered)
        split |= keys
    return split


def _task_order(runs: list[Run]) -> list[str]:
    return list(REPORTS) + sorted({r.task for r in runs} - set(REPORTS))


def build_tables(runs: list[Run]) -> list[Table]:
    """The paper's tables from ``runs`` (already one run per seed; see :func:`dedupe_seeds`)."""
    tables = []
    for family, title in FAMILIES.items():
        mine = [r for r in runs if (r.family if r.family in FAMILIES else "other") == family]
        if not mine:
            continue
        split = assign_variants(mine)  # this table's tasks only, not another table's
        task_order = _task_order(mine)
        columns: dict[str, Column] = {}
        labels: dict[str, list[str]] = {}
        for task in task_order:
            for run in (r for r in mine if r.task == task):
                title_of = run.report.title if run.report else task
                labels.setdefault(task, [c.label for c in run.report.columns]
                                  if run.report else [])
                lower = {c.label for c in run.report.columns if c.lower_is_better} \
                    if run.report else set()
                for key in run.values:
                    columns.setdefault(key, _column(key, title_of, lower))
        cols = sorted(columns.values(), key=lambda c: (task_order.index(c.task),
                                                       _label_order(c, labels)))
        rows: dict[tuple, Row] = {}
        for run in mine:
            row = rows.setdefault((run.method, run.budget_level, run.size, run.variant),
                                  Row(run.method, run.budget_level, run.size, run.variant))
            row.runs.append(run)
            for key, value in run.values.items():
                row.cells.setdefault(key, Cell([])).values.append(value)
        tasks = list(dict.fromkeys(c.task for c in cols))
        has_ave = family == "glue" and len(tasks) > 1
        for row in rows.values():
            row.all_ave = _all_average(row, cols, tasks) if has_ave else None
        differs = sorted(split | set(differing_keys(mine)), key=_key_order)
        tables.append(Table(family, title, cols, sorted(rows.values(), key=_row_order),
                            has_ave, has_ave and len(tasks) == 8, differs))
    return tables


def _column(key: str, title: str, lower: set[str]) -> Column:
    task, _, label = key.partition(":")
    return Column(key, task, title, label, label in lower)


def _label_order(col: Column, labels: dict[str, list[str]]) -> int:
    mine = labels.get(col.task, [])
    return mine.index(col.label) if col.label in mine else len(mine)


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


def compare_against(tables: list[Table], against: str = "lora") -> list[Comparison]:
    """Each method against the ``against`` method at the same budget level, per column: its
    row with the same distinguishing config values, else its only row at that level."""
    out = []
    for table in tables:
        bases: dict[int | None, list[Row]] = {}
        for r in table.rows:
            if r.method == against:
                bases.setdefault(r.budget_level, []).append(r)
        for row in table.rows:
            same_level = bases.get(row.budget_level, [])
            base = next((b for b in same_level if b.variant == row.variant),
                        same_level[0] if len(same_level) == 1 else None)
            if row.method == against or base is None:
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
        groups.setdefault((run.task, run.method, run.budget_level, run.size, run.variant),
                          Row(run.method, run.budget_level, run.size, run.variant)
                          ).runs.append(run)
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
    notes: list[str]
    """Warnings about runs read but not counted: repeated seeds, settings under --min-seeds."""
    show_paper: bool = False
    against: str = "lora"
    """The method every other one is compared with (``--against``)."""
    per_seed: bool = False
    """Show every seed's value beside the means (``--per-seed``)."""
    tunes: list[Tune] = field(default_factory=list)
    """The tunes (``adalora tune``) among the reported folders: their trials are left out
    of the tables and said in a tuning table of their own."""

    @property
    def against_name(self) -> str:
        return METHOD_NAMES.get(self.against, self.against)


def keep_min_seeds(runs: list[Run], minimum: int) -> tuple[list[Run], list[str]]:
    """Leave out the settings (task, method, size, config) with fewer than ``minimum`` seeds,
    with a note naming each: after a learning-rate search on one seed, the rates not carried
    on to more seeds are not results to plot or test."""
    pools: dict[tuple, list[Run]] = {}
    for run in runs:
        pools.setdefault((run.task, run.method, run.budget_level, run.size, run.digest),
                         []).append(run)
    kept, notes = [], []
    for (task, method, level, size, _), same in pools.items():
        if len(same) >= minimum:
            kept.extend(same)
            continue
        name = METHOD_NAMES.get(method, method)
        where = ", ".join(str(r.path) for r in same)
        notes.append(f"left out {name} {size}{f' ({level})' if level is not None else ''} "
                     f"{task}: {len(same)} seed{'s' * (len(same) != 1)} < --min-seeds "
                     f"{minimum} ({where})")
    kept_ids = {id(r) for r in kept}
    return [r for r in runs if id(r) in kept_ids], notes


def build_report(paths: list[Path], show_paper: bool = False,
                 eval_name: str | None = None, min_seeds: int = 1,
                 against: str = "lora", per_seed: bool = False) -> Report:
    runs, skipped = load_runs(paths, eval_name)
    tunes, tune_notes = read_tunes(paths)
    for tune in tunes:  # the search is not a result: its trials go to the tuning table
        trials = tune.trial_dirs()
        runs = [r for r in runs if r.path.resolve() not in trials]
        skipped = [(p, why) for p, why in skipped if p.resolve() not in trials]
    inside = [f"{outer} is a run directory holding {n} other run{'s' * (n != 1)} in its "
              "folder; they are reported as runs of their own (keep a sweep's runs out of "
              "run directories: --sweep-dir)"
              for outer, n in nested_runs([r.path for r in runs]
                                          + [p for p, _ in skipped if not p.is_symlink()])]
    runs, duplicates = dedupe_seeds(runs)
    runs, left_out = keep_min_seeds(runs, min_seeds)
    tables = build_tables(runs)
    return Report(tables, compare_against(tables, against), training_cost(runs), runs,
                  skipped, tune_notes + inside + duplicates + left_out, show_paper, against,
                  per_seed, tunes)
