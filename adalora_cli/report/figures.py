"""The report's figures (PNG), one file per task and setting, from finished runs only.

- Figure 3: the final rank of every adapted matrix, averaged over seeds, per task, method
  and budget level (cells annotated with one decimal where a mean rank is not whole; rows
  named as in :mod:`adalora_cli.heatmap`, ``W_f1 (up_proj)``).
- Figure 4: metric against "# Params", one line per method and setting (one colour per
  method, a line style per setting), a band of ± the sample std over seeds around the mean;
  the metric axis says its unit (%, x 100 for a correlation).
- The tuning metric of every trial of a tune (``adalora tune``) against its learning rate,
  one line per method, log-x (a pruned trial hollow, at the last value it reported).
- Figure 5: the orthogonality penalty R (``orth_reg`` in metrics.jsonl) over training,
  mean over seeds with the min-max band, on a log axis labelled in plain numbers. The paper
  plots the squared norms of single matrices; R is what the loss used (Eq. 4,
  docs/maths.md#orthogonal-regularizer), so it is what we logged.

Figures group runs exactly as the tables do: one curve or heatmap per experiment (runs that
differ only in their seed), labelled with the config values that set it apart, if any. A run
whose rank pattern or metrics file is malformed is left out of its figure with a warning; it
never stops the others.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections import defaultdict
from pathlib import Path

from matplotlib import rcParams
from matplotlib.font_manager import FontProperties
from matplotlib.ticker import Formatter, FuncFormatter, LogLocator, NullFormatter

from ..heatmap import rank_figure
from ..rundir.layout import RANK_PATTERN
from ..rundir.run import read_metrics
from .runs import Column, Run
from .tables import METHOD_NAMES, Report, Row, Table
from .tuning import LR, Tune


def _plt():
    import matplotlib

    matplotlib.use("Agg")  # files only: never needs a display
    import matplotlib.pyplot as plt
    return plt


def _slug(*parts: object) -> str:
    """A file name from a figure's parts, joined by '-': ``rte-adalora-b144``,
    ``causal_lm-adalora-r0=4-bT=28`` (task names keep their underscores; b(T) is bT)."""
    text = "-".join(str(p).replace("(", "").replace(")", "") for p in parts
                     if p not in (None, ""))
    return re.sub(r"[^A-Za-z0-9._=-]+", "-", text).strip("-")


def _setting(run: Run) -> tuple:
    return (run.task, run.method, run.budget_level, run.size, run.variant)


def _variant_words(variant: tuple[tuple[str, str], ...]) -> str:
    return " ".join(f"{k}={v}" for k, v in variant)


def _setting_name(method: str, level: int | None, size: str,
                  variant: tuple[tuple[str, str], ...] = ()) -> str:
    name = METHOD_NAMES.get(method, method)
    base = f"{name} b(T)={level}" if level is not None else f"{name} {size}".strip()
    return f"{base} {_variant_words(variant)}".strip()


def mean_rank_pattern(patterns: list[dict[str, float]]) -> dict[str, float]:
    """Per matrix, the mean final rank over the seeds whose pattern has that matrix, in the
    patterns' order (the model's, which the heatmap's rows follow)."""
    keys = list(dict.fromkeys(k for p in patterns for k in p))
    return {k: statistics.fmean(p[k] for p in patterns if k in p) for k in keys}


def rank_heatmaps(runs: list[Run], out: Path, warnings: list[str]) -> list[Path]:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for run in runs:
        file = run.path / RANK_PATTERN
        if not file.is_file():
            continue
        try:
            pattern = json.loads(file.read_text())
            groups[_setting(run)].append({str(k): float(v) for k, v in pattern.items()})
        except (OSError, ValueError, TypeError, AttributeError):
            warnings.append(f"{file}: not a {{module: rank}} mapping; left out of Figure 3")
    paths = []
    _plt()  # the Agg backend before any figure
    for (task, method, level, size, variant), patterns in sorted(groups.items(), key=str):
        seeds = f"{len(patterns)} seed{'s' if len(patterns) > 1 else ''}"
        fig = rank_figure(mean_rank_pattern(patterns),
                          f"{task} {_setting_name(method, level, size, variant)}: final rank, "
                          f"mean of {seeds}", colorbar_label="final rank (mean over seeds)")
        name = _slug(task, method, f"b{level}" if level is not None else size,
                     *(f"{k}={v}" for k, v in variant))
        paths.append(_save(fig, out / f"fig3_rank_{name}.png"))
    return paths


def _short_params(x: float, _pos: object = None) -> str:
    """An axis tick for a parameter count: 50K, 100K, 1.5M (the table keeps the digits)."""
    if x >= 1e6:
        return f"{x / 1e6:g}M"
    return f"{x / 1e3:g}K" if x >= 1e3 else f"{x:g}"


def _seed_words(counts: set[int]) -> str:
    low, high = min(counts), max(counts)
    return f"{low} seed{'s' if high > 1 else ''}" if low == high else f"{low}-{high} seeds"


_STYLES = [("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"), ((0, (5, 1, 1, 1)), "v")]


def _line_looks(keys: list[tuple]) -> dict[tuple, dict]:
    """Plot styles for (method, variant) lines: a colour per method, so that the lines of
    one method at several learning rates read as one family, and a line style and marker
    per variant within it. Matplotlib's default cycle has 10 colours; today's eight methods
    at two or three rates each would repeat them and make two methods look alike, so past
    tab10 come tab20's lighter shades (20 in all)."""
    from matplotlib import colormaps

    colours = [*colormaps["tab10"].colors, *colormaps["tab20"].colors[1::2]]
    methods = {m: i for i, m in enumerate(dict.fromkeys(method for method, _ in keys))}
    looks, seen = {}, defaultdict(int)
    for method, variant in keys:
        style, marker = _STYLES[seen[method] % len(_STYLES)]
        seen[method] += 1
        looks[(method, variant)] = {"color": colours[methods[method] % len(colours)],
                                    "linestyle": style, "marker": marker}
    return looks


PERCENT = frozenset({"accuracy", "f1", "macro_f1", "exact_match", "rouge1", "rouge2", "rougeL",
                     "rougeLsum"})
"""Metrics that are shares, shown on the report's scale as percentages (GLUE's fractions
x100; SQuAD's and ROUGE's stored x100 already; ``tasks/columns.py``)."""
TIMES_100 = frozenset({"matthews", "pearson", "spearman", "corr"})
"""Correlations, shown x100 as the paper shows them: not a percentage."""


def _unit(col: Column, rows: list[Row]) -> str:
    """The unit of a report column, for an axis label: ' (%)', ' (× 100)' or '' (a loss, a
    perplexity, a task's own score), read from the column's metric as its runs recorded it."""
    for run in (r for row in rows for r in row.runs if r.task == col.task and r.report):
        for recorded in run.report.columns:
            if recorded.label == col.label:
                if recorded.metric in PERCENT:
                    return " (%)"
                return " (× 100)" if recorded.metric in TIMES_100 \
                    and recorded.scale == 100 else ""
    return ""


def budget_curves(tables: list[Table], out: Path) -> list[Path]:
    plt = _plt()
    paths = []
    for table in tables:
        for task in dict.fromkeys(c.task for c in table.columns):
            cols = [c for c in table.columns if c.task == task]
            # past a handful of lines (today's eight methods) the legend would hide points:
            # it goes beside the axes, which widen the figure to make room
            beside = len({(r.method, r.variant) for r in table.rows}) > 4
            fig, axes = plt.subplots(1, len(cols), squeeze=False, figsize=(
                max(5.6, 4.6 * len(cols)) + (1.6 * len(cols) if beside else 0), 3.8))
            for ax, col in zip(axes[0], cols):
                # one line per method and distinguishing config (e.g. one per lr)
                by_method: dict[tuple, list] = defaultdict(list)
                seeds: dict[tuple, set[int]] = defaultdict(set)
                for row in table.rows:
                    cell = row.cells.get(col.key)
                    if cell is not None:
                        by_method[(row.method, row.variant)].append(
                            (row.params, cell.mean, cell.std or 0.0))
                        seeds[(row.method, row.variant)].add(cell.n)
                looks = _line_looks(list(by_method))
                for (method, variant), points in by_method.items():
                    points.sort()
                    x, y, err = zip(*points)
                    name = METHOD_NAMES.get(method, method)
                    label = f"{name} {_variant_words(variant)}".strip()
                    line, = ax.plot(x, y, **looks[(method, variant)],
                                    label=f"{label} ({_seed_words(seeds[(method, variant)])})")
                    # the band is mean +- sample std over seeds (zero where one seed)
                    ax.fill_between(x, [m - e for m, e in zip(y, err)],
                                    [m + e for m, e in zip(y, err)],
                                    color=line.get_color(), alpha=0.2, linewidth=0)
                xs = [p for pts in by_method.values() for p, _, _ in pts if p > 0]
                # budget levels double, so a log axis spaces them evenly
                if xs and max(xs) > 3 * min(xs):
                    ax.set_xscale("log")
                    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
                    ax.xaxis.set_minor_formatter(NullFormatter())
                ax.xaxis.set_major_formatter(FuncFormatter(_short_params))
                ax.set_xlabel("# Params (adapter; AdaLoRA after pruning)")
                better = "lower" if col.lower_is_better else "higher"
                ax.set_ylabel(f"{col.title} {col.label}{_unit(col, table.rows)}, "
                              f"{better} is better")
                ax.grid(alpha=0.3)
                if beside:
                    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
                else:
                    ax.legend(fontsize=7)
            fig.suptitle(f"{cols[0].title}: mean ± std over seeds", fontsize=10)
            paths.append(_save(fig, out / f"fig4_budget_{_slug(task)}.png"))
    return paths


def _plain(value: float, _pos: object = None) -> str:
    return f"{value:g}"


class LogMinorLabels(Formatter):
    """Labels for the ticks between the decades of a log y axis (2, 3, ... 9 x 10^k), as
    plain numbers and only as many as fit: all of them where a decade is tall enough for
    labels 0.8 and 0.9 apart, else those at 2, 3 and 5, else at 2 and 5, else none (the
    decades keep theirs). Every minor tick labelled, R falling from 2 to 0.2 printed 0.7,
    0.8, 0.9 and 1 over one another; across two decades every one of them did."""

    SUBSETS = ((2, 3, 4, 5, 6, 7, 8, 9), (2, 3, 5), (2, 5), ())
    GAP = 1.3
    """Least distance between two labels' centres, in label heights."""

    def __call__(self, x: float, pos: object = None) -> str:
        return self.format_ticks([x])[0]

    def format_ticks(self, values) -> list[str]:
        shown = self._fitting_subset()
        return [_plain(v) if _mantissa(v) in shown else "" for v in values]

    def _fitting_subset(self) -> tuple[int, ...]:
        low, high = sorted(self.axis.get_view_interval())
        if low <= 0 or high <= low:
            return ()
        axes = self.axis.axes
        height_pt = axes.get_position().height * axes.figure.get_figheight() * 72
        per_decade = height_pt / math.log10(high / low)  # points
        font_pt = FontProperties(size=rcParams["ytick.labelsize"]).get_size_in_points()
        for subset in self.SUBSETS:
            marks = [1, *subset, 10]  # the closest two labels in a decade, in decades
            gap = min(math.log10(b / a) for a, b in zip(marks, marks[1:]))
            if gap * per_decade >= self.GAP * font_pt:
                return subset
        return ()


def _mantissa(value: float) -> int | None:
    """2 for 0.02, 200 and 2; None for a value that is no whole multiple of its decade."""
    if value <= 0:
        return None
    m = value / 10 ** math.floor(math.log10(value))
    return round(m) if abs(m - round(m)) < 1e-6 else None


def orth_curves(runs: list[Run], out: Path, warnings: list[str]) -> list[Path]:
    curves: dict[str, dict[tuple, list[dict[int, float]]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        try:
            rows = read_metrics(run.path)
        except (OSError, ValueError):
            warnings.append(f"{run.path}: metrics.jsonl unreadable; left out of Figure 5")
            continue
        series = {int(r["step"]): float(r["orth_reg"]) for r in rows
                  if isinstance(r, dict) and "orth_reg" in r and "step" in r}
        if series:
            curves[run.task][_setting(run)[1:]].append(series)
    plt = _plt()
    paths = []
    for task, settings in sorted(curves.items()):
        fig, ax = plt.subplots(figsize=(6, 3.6))
        for (method, level, size, variant), runs_series in sorted(settings.items(), key=str):
            steps = sorted(set.intersection(*(set(s) for s in runs_series)))
            values = [[s[t] for s in runs_series] for t in steps]
            ax.plot(steps, [statistics.fmean(v) for v in values],
                    label=f"{_setting_name(method, level, size, variant)} "
                          f"({_seed_words({len(runs_series)})})")
            ax.fill_between(steps, [min(v) for v in values], [max(v) for v in values], alpha=0.2)
        ax.set_yscale("log")
        # plain numbers (0.2, 0.5, 1, 2) on the log axis, not 2 x 10^-1
        ax.yaxis.set_major_formatter(FuncFormatter(_plain))
        ax.yaxis.set_minor_formatter(LogMinorLabels())
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("orthogonality penalty R")
        ax.set_title(f"{task}: orthogonal regularizer over training", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        paths.append(_save(fig, out / f"fig5_orth_{_slug(task)}.png"))
    return paths


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=120)
    except OSError as err:  # matplotlib's own error does not say which file (a full disk)
        raise OSError(err.errno, err.strerror or str(err), str(path)) from None
    finally:
        _plt().close(fig)
    return path


def lr_curves(tunes: list[Tune], out: Path) -> list[Path]:
    """Per tune and (config, budget level): the tuning metric of each trial against its
    learning rate, one line per method, log x; a pruned trial is drawn hollow at the last
    value it reported."""
    plt = _plt()
    paths = []
    for tune in tunes:
        groups: dict[tuple, list[dict]] = defaultdict(list)
        for c in tune.data["cells"]:
            if any(LR in (t.get("params") or {}) for t in c.get("trials", [])):
                groups[(Path(c["config"]).stem, c.get("budget_level"))].append(c)
        for (stem, level), cells in groups.items():
            fig, ax = plt.subplots(figsize=(6.4, 4.0))
            metric = cells[0]["metric"]
            for c in cells:
                done = sorted((t["params"][LR], t["value"]) for t in c["trials"]
                              if t["state"] == "complete" and LR in t["params"])
                name = METHOD_NAMES.get(c["method"], c["method"])
                line = None
                if done:
                    line, = ax.plot(*zip(*done), marker="o", label=name)
                pruned = [(t["params"][LR], t["reported"][str(t["last_step"])])
                          for t in c["trials"] if t["state"] == "pruned"
                          and LR in t["params"] and t.get("last_step") is not None]
                if pruned:
                    ax.scatter(*zip(*pruned), facecolors="none",
                               edgecolors=line.get_color() if line else "grey",
                               label=f"{name} (pruned: last reported)")
            ax.set_xscale("log")
            ax.set_xlabel("learning rate (log scale)")
            split, _, name = metric.partition("/")
            ax.set_ylabel(f"{name} on {split} (fraction; "
                          f"{'lower' if cells[0]['direction'] == 'minimize' else 'higher'} "
                          "is better)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
            level_words = f", b(T)={level}" if level is not None else ""
            ax.set_title(f"{stem}{level_words}: {metric} per trial (tuning seed "
                         f"{tune.data['seeds'][0]})", fontsize=10)
            slug = _slug(tune.data["name"], stem, f"b{level}" if level is not None else "")
            paths.append(_save(fig, out / f"tune_lr_{slug}.png"))
    return paths


def write_figures(report: Report, out: Path) -> tuple[list[Path], list[str]]:
    """Write every figure into ``out``; returns the files and any warnings."""
    out.mkdir(parents=True, exist_ok=True)
    warnings: list[str] = []
    paths = rank_heatmaps(report.runs, out, warnings)
    paths += budget_curves(report.tables, out)
    paths += orth_curves(report.runs, out, warnings)
    paths += lr_curves(report.tunes, out)
    return paths, warnings
