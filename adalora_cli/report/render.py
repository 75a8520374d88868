"""Rendering a :class:`~adalora_cli.report.Report`: rich terminal tables, Markdown, CSV, LaTeX.

Every format shows the same grid, built once by :func:`_grid`: one line per row of ours
("mean ± std (n seeds)", the best mean of each column in bold) and, when the paper's
numbers are asked for, a "paper" line and a "Δ" line (ours minus paper) beneath it.
CSV is long-form instead (one line per row and column), for pandas or a spreadsheet.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table as RichTable

from . import tuning
from .paper import ALL_AVE
from .tables import Cell, Report, Row, Table, short_key

FORMATS = ("rich", "markdown", "csv", "latex")


@dataclass
class Out:
    """One grid cell: a statistic (mean, std, n) or plain text, maybe the column's best."""

    mean: float | None = None
    std: float | None = None
    n: int | None = None
    text: str = ""
    best: bool = False
    signed: bool = False  # a difference: always show its sign


LOWER = " ↓"
"""After a column's name when its lowest mean is the best (a loss, a perplexity)."""


def column_header(col) -> str:
    return f"{col.title} {col.label}" + (LOWER if col.lower_is_better else "")


def fmt_params(x: float) -> str:
    if x != x:  # nan: a run without a parameter count
        return "?"
    if x >= 1e8:
        return f"{x / 1e6:.0f}M"
    if x >= 1e5:
        return f"{x / 1e6:.2f}M"
    return f"{x / 1e3:.2f}K" if x >= 1e3 else f"{x:.0f}"


def fmt_p(p: float | None) -> str:
    if p is None:
        return "n/a, < 2 seeds"
    if math.isnan(p):
        return "n/a, no spread"
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def _seconds(x: float | None) -> str:
    return "" if x is None else f"{x:.2f}" if x < 10 else f"{x:.1f}"


def _level(level: int | None) -> str:
    return "" if level is None else str(level)


def _grid(table: Table, show_paper: bool) -> tuple[list[str], list[tuple[str, list[Out]]]]:
    """Headers and (kind, cells) lines; kind is 'ours', 'paper' or 'diff'."""
    keys = [c.key for c in table.columns] + ([ALL_AVE] if table.has_all_ave else [])
    headers = ["Method", "# Params", "b(T)", *map(short_key, table.differs)]
    headers += [column_header(c) for c in table.columns]
    headers += [ALL_AVE] if table.has_all_ave else []
    best = {k: table.best(k) for k in keys}
    lines = []
    for row in table.rows:
        cells = [Out(text=row.label), Out(text=fmt_params(row.params)),
                 Out(text=_level(row.budget_level))]
        cells += [Out(text=row.shown(k)) for k in table.differs]
        for key in keys:
            value = row.all_ave if key == ALL_AVE else row.cells.get(key)
            mean = value.mean if isinstance(value, Cell) else value
            cells.append(Out(mean, value.std if isinstance(value, Cell) else None,
                             value.n if isinstance(value, Cell) else None,
                             best=mean is not None and mean == best[key]))
        lines.append(("ours", cells))
        if show_paper:
            lines += _paper_lines(table, row, keys)
    return headers, lines


def _paper_lines(table: Table, row: Row, keys: list[str]) -> list[tuple[str, list[Out]]]:
    paper = {k: row.paper(k) for k in keys if k != ALL_AVE or table.paper_all_ave}
    if not any(v is not None for v in paper.values()):
        return []
    ours = {k: row.all_ave if k == ALL_AVE else (row.cells[k].mean if k in row.cells else None)
            for k in keys}
    blank = [Out() for _ in range(2 + len(table.differs))]
    label = [Out(text="paper"), *blank]
    delta = [Out(text="Δ vs paper"), *[Out() for _ in blank]]
    for key in keys:
        p = paper.get(key)
        label.append(Out(p))
        has_both = p is not None and ours[key] is not None
        delta.append(Out(ours[key] - p, signed=True) if has_both else Out())
    return [("paper", label), ("diff", delta)]


def _text(c: Out, style: str) -> str:
    """One cell as text; style 'plain', 'markdown' or 'latex'."""
    if c.mean is None:
        return c.text
    mean = f"{c.mean:+.2f}" if c.signed else f"{c.mean:.2f}"
    if c.best:
        mean = {"markdown": f"**{mean}**", "latex": rf"\textbf{{{mean}}}"}.get(style, mean)
    if c.n is None:
        return mean
    pm = r"$\pm$" if style == "latex" else "±"
    spread = f" {pm} {c.std:.2f}" if c.std is not None else ""
    return f"{mean}{spread} ({c.n})"


def _comparison_grid(report: Report, table: Table) -> tuple[list[str], list[list[str]]]:
    comps = [c for c in report.comparisons if c.table is table]
    headers = ["Method", "b(T)", *map(short_key, table.differs), "vs"]
    headers += [column_header(c) for c in table.columns]
    rows: dict[int, list[str]] = {}
    first = 3 + len(table.differs)
    for comp in comps:
        line = rows.setdefault(id(comp.row), [
            comp.row.label, _level(comp.row.budget_level),
            *[comp.row.shown(k) for k in table.differs],
            comp.baseline.label] + [""] * len(table.columns))
        i = first + [c.key for c in table.columns].index(comp.column)
        line[i] = f"{comp.diff:+.2f} (p {fmt_p(comp.p)})"
    return headers, list(rows.values())


def _seed_order(row: Row) -> list[int | None]:
    """The seeds of a row's runs, in order (None, a run without one, last)."""
    return sorted({r.seed for r in row.runs}, key=lambda s: (s is None, s or 0))


def _per_seed(row: Row, key: str, seeds: list[int | None]) -> str:
    """The row's value of column ``key`` from each of ``seeds``, in that order ('-' for a
    seed with no run that has the column: a row may span several tasks; two runs of one
    seed, possible when configs pooled into one row differ, are both shown: '81.00,82.00')."""
    by_seed: dict[int | None, list[str]] = {}
    for r in row.runs:
        if r.values.get(key) is not None:
            by_seed.setdefault(r.seed, []).append(f"{r.values[key]:.2f}")
    return " / ".join(",".join(by_seed[s]) if s in by_seed else "-" for s in seeds)


def _seed_grid(table: Table) -> tuple[list[str], list[list[str]]]:
    """Every seed's value beside the means (``--per-seed``): one line per row of the table,
    its seeds in a column, each task column's values in that seed order."""
    headers = ["Method", "b(T)", *map(short_key, table.differs), "seeds"]
    headers += [column_header(c) for c in table.columns]
    lines = []
    for row in table.rows:
        seeds = _seed_order(row)
        lines.append([row.label, _level(row.budget_level),
                      *[row.shown(k) for k in table.differs],
                      " / ".join("?" if s is None else str(s) for s in seeds),
                      *[_per_seed(row, c.key, seeds) for c in table.columns]])
    return headers, lines


PER_SEED = ("Per seed: each setting's value from every seed, in the order of its seeds "
            "column ('-' where that seed has no run of the column's task).")


def _differs(report: Report) -> list[str]:
    return list(dict.fromkeys(k for t in report.tables for k in t.differs))


def _cost_grid(report: Report) -> tuple[list[str], list[list[str]]]:
    differs = _differs(report)
    headers = ["Task", "Method", "b(T)", *map(short_key, differs), "# Params", "Mem GiB",
               "s/epoch", "Device", "Runs"]
    if report.show_paper:
        headers += ["Paper GB", "Paper min/epoch"]
    lines = []
    for c in report.cost:
        line = [c.task, c.row.label, _level(c.row.budget_level),
                *[c.row.shown(k) for k in differs], fmt_params(c.row.params),
                f"{c.memory_gib:.3f}" if c.memory_gib is not None else "",
                _seconds(c.seconds_per_epoch),
                c.device, str(len(c.row.runs))]
        if report.show_paper:
            line += [f"{c.paper[0]:.3f}", f"{c.paper[1]:.0f}"] if c.paper else ["", ""]
        lines.append(line)
    return headers, lines


# --------------------------------------------------------------------------- formats


def _md_table(headers: list[str], lines: list[list[str]]) -> list[str]:
    def esc(s: str) -> str:
        return s.replace("|", "\\|")
    out = ["| " + " | ".join(map(esc, headers)) + " |",
           "|" + "|".join(["---"] + ["---:"] * (len(headers) - 1)) + "|"]
    out += ["| " + " | ".join(map(esc, line)) + " |" for line in lines]
    return out


def _any_lower(report: Report) -> bool:
    return any(c.lower_is_better for t in report.tables for c in t.columns)


def render_markdown(report: Report) -> str:
    out = ["# Results", "",
           "Mean ± sample std (ddof = 1) over seeds, number of seeds in parentheses; "
           "the best mean of each column in bold"
           + (f" (the lowest in a column marked{LOWER})" if _any_lower(report) else "")
           + ". # Params: adapter parameters as the paper "
           "counts them (AdaLoRA: after pruning). b(T): the budget level.", ""]
    for table in report.tables:
        headers, lines = _grid(table, report.show_paper)
        out += [f"## {table.title}", ""]
        out += _md_table(headers, [[_text(c, "markdown") for c in cells] for _, cells in lines])
        headers, rows = _comparison_grid(report, table)
        if rows:
            out += ["", f"Against {report.against_name} at the same budget level: "
                    "difference of means (two-sided Welch t-test p-value across seeds).", ""]
            out += _md_table(headers, rows)
        if report.per_seed:
            out += ["", PER_SEED, ""] + _md_table(*_seed_grid(table))
        out.append("")
    headers, rows = _cost_grid(report)
    out += ["## Training cost (paper Table 9)", ""] + _md_table(headers, rows) + [""]
    for tune in report.tunes:
        out += ["## Tuning", "", tuning.markdown(tune)]
    return "\n".join(out)


def _latex_escape(s: str) -> str:
    for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"),
                 ("#", r"\#"), ("Δ", r"$\Delta$"), ("±", r"$\pm$"), ("↓", r"$\downarrow$")):
        s = s.replace(a, b)
    return s


def _latex_tabular(headers: list[str], lines: list[list[str]], rules_before: set[int],
                   caption: str) -> list[str]:
    out = [r"\begin{table}[t]", r"\centering", rf"\caption{{{_latex_escape(caption)}}}",
           r"\begin{tabular}{l" + "r" * (len(headers) - 1) + "}", r"\toprule",
           " & ".join(_latex_escape(h) for h in headers) + r" \\", r"\midrule"]
    for i, line in enumerate(lines):
        if i in rules_before:
            out.append(r"\midrule")
        out.append(" & ".join(line) + r" \\")
    return out + [r"\bottomrule", r"\end{tabular}", r"\end{table}", ""]


def render_latex(report: Report) -> str:
    """booktabs tables (needs \\usepackage{booktabs}); a rule between budget levels."""
    out = [r"% generated by adalora report; needs \usepackage{booktabs}", ""]
    for table in report.tables:
        headers, lines = _grid(table, report.show_paper)
        body, rules, last = [], set(), object()
        for kind, cells in lines:
            if kind == "ours":
                level = cells[2].text
                if body and level != last:
                    rules.add(len(body))
                last = level
            body.append([_text(c, "latex") if c.mean is not None else _latex_escape(c.text)
                         for c in cells])
        out += _latex_tabular(headers, body, rules,
                              f"{table.title}: mean ± std over seeds (number of seeds).")
        if report.per_seed:
            headers, rows = _seed_grid(table)
            out += _latex_tabular(headers, [[_latex_escape(x) for x in r] for r in rows],
                                  set(), f"{table.title}, per seed. {PER_SEED}")
    headers, rows = _cost_grid(report)
    out += _latex_tabular(headers, [[_latex_escape(x) for x in r] for r in rows], set(),
                          "Training cost: peak memory and time per epoch.")
    return "\n".join(out)


def render_csv(report: Report) -> str:
    """Long form: one line per table row and column, with paper values and the test against
    the baseline method (``diff_vs_lora``, ``p_vs_lora``; ``diff_vs_adalora`` ... with
    ``--against adalora``)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    differs = _differs(report)  # config columns that tell rows apart, when any do
    w.writerow(["table", "method", "label", "budget_level", "size", *map(short_key, differs),
                "params", "column", "mean", "std", "n", "best", "paper", "diff_vs_paper",
                f"diff_vs_{report.against}", f"p_vs_{report.against}"]
               + (["seeds", "values"] if report.per_seed else []))
    comps = {(id(c.row), c.column): c for c in report.comparisons}
    for table in report.tables:
        keys = [c.key for c in table.columns] + ([ALL_AVE] if table.has_all_ave else [])
        for row in table.rows:
            for key in keys:
                cell = row.cells.get(key)
                mean = row.all_ave if key == ALL_AVE else (cell.mean if cell else None)
                if mean is None:
                    continue
                paper = row.paper(key) if key != ALL_AVE or table.paper_all_ave else None
                comp = comps.get((id(row), key))
                w.writerow([table.family, row.method, row.label, _level(row.budget_level),
                            row.size, *[row.shown(k) for k in differs], f"{row.params:.0f}",
                            key, f"{mean:.4f}",
                            f"{cell.std:.4f}" if cell and cell.std is not None else "",
                            cell.n if cell else "", int(mean == table.best(key)),
                            "" if paper is None else paper,
                            "" if paper is None else f"{mean - paper:.4f}",
                            f"{comp.diff:.4f}" if comp else "",
                            "" if comp is None or comp.p is None else f"{comp.p:.6g}"]
                           + (_csv_seeds(row, key) if report.per_seed else []))
    return buf.getvalue()


def _csv_seeds(row: Row, key: str) -> list[str]:
    """``seeds`` and ``values`` of a CSV line (``--per-seed``), ';'-separated, in one order:
    the runs that have the column, by seed."""
    runs = sorted((r for r in row.runs if r.values.get(key) is not None),
                  key=lambda r: (r.seed is None, r.seed or 0))
    return [";".join("" if r.seed is None else str(r.seed) for r in runs),
            ";".join(f"{r.values[key]:.4f}" for r in runs)]


def render_cost_csv(report: Report) -> str:
    buf = io.StringIO()
    headers, rows = _cost_grid(report)
    csv.writer(buf, lineterminator="\n").writerows([headers, *rows])
    return buf.getvalue()


def render_rich(report: Report, console: Console) -> None:
    styles = {"ours": "", "paper": "dim", "diff": "dim italic"}
    for table in report.tables:
        headers, lines = _grid(table, report.show_paper)
        rt = RichTable(title=table.title, caption="mean ± std (seeds); best in bold green")
        for i, h in enumerate(headers):
            rt.add_column(h.replace(" ", "\n", 1) if i > 2 + len(table.differs) else h,
                          justify="left" if i == 0 else "right")
        for kind, cells in lines:
            rt.add_row(*[f"[bold green]{_text(c, 'plain')}[/]" if c.best else _text(c, "plain")
                         for c in cells], style=styles[kind])
        console.print(rt)
        headers, rows = _comparison_grid(report, table)
        if rows:
            console.print(_plain_table(f"vs {report.against_name} at the same budget level "
                                       "(Welch t-test)", headers, rows))
        if report.per_seed:
            console.print(_plain_table(f"{table.title}, per seed", *_seed_grid(table)))
    console.print(_plain_table("Training cost (paper Table 9)", *_cost_grid(report)))
    for tune in report.tunes:
        lines = tuning.rows(tune)
        if lines:
            console.print(_plain_table(tuning.title(tune), list(lines[0]),
                                       [list(r.values()) for r in lines]))


def _plain_table(title: str, headers: list[str], rows: list[list[str]]) -> RichTable:
    table = RichTable(title=title)
    for h in headers:
        table.add_column(h)
    for r in rows:
        table.add_row(*r)
    return table
