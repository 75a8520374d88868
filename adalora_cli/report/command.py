"""``adalora report``'s work between parsing and printing: check the arguments, read the run
directories, then print the tables and write the requested files and figures."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from ..config import ConfigError
from ..errors import warning


def run_report(paths: list[Path], fmt: str, out_dir: Path | None, *, paper: bool,
               figures: bool, eval_name: str | None, out: Console, err: Console,
               min_seeds: int = 1) -> None:
    """``fmt``: one of render.FORMATS, several joined by commas, or ``all``. Skipped runs
    and left-out runs are warnings on ``err``; no finished run at all is a ConfigError."""
    from .render import FORMATS
    from .tables import build_report

    formats = list(FORMATS) if fmt == "all" else [f.strip() for f in fmt.split(",")]
    bad = [f for f in formats if f not in FORMATS]
    if bad:
        raise ConfigError(f"unknown --format {bad[0]!r}; choose from "
                          f"{', '.join(FORMATS)} or all")
    missing = [p for p in paths if not p.exists()]
    if missing:
        raise ConfigError(f"{missing[0]} does not exist; pass run directories or runs/")
    if out_dir is not None and out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"--out {out_dir} is a file; pass a folder for the report "
                          "(it is created if missing)")
    if min_seeds < 1:
        raise ConfigError(f"--min-seeds {min_seeds} must be at least 1")
    result = build_report(list(paths), show_paper=paper, eval_name=eval_name,
                          min_seeds=min_seeds)
    for path, reason in result.skipped:
        _warn(err, f"skipped {path}: {reason}")
    for note in result.notes:
        _warn(err, note)
    if not result.runs:
        raise ConfigError(f"no finished runs under {', '.join(map(str, paths))}")
    emit(result, formats, out_dir, figures, out, err)


def _warn(err: Console, text: str) -> None:
    warning(text, err.file)


def emit(result, formats: list[str], out_dir: Path | None, figures: bool, out: Console,
         err: Console) -> None:
    """Rich tables on ``out``; the text formats on stdout, or as files into ``out_dir``
    (with the figures), listed on ``err``. Written to files, the report is still shown:
    the first text format asked for goes to stdout too, unless the rich tables did."""
    from . import render

    texts = {"markdown": ("report.md", render.render_markdown),
             "latex": ("report.tex", render.render_latex),
             "csv": ("results.csv", render.render_csv)}
    if "rich" in formats:
        render.render_rich(result, out)
    written, shown = [], False
    for name in formats:
        if name == "rich":
            continue
        filename, fn = texts[name]
        if out_dir is None or (not shown and "rich" not in formats):
            print(fn(result))
            shown = True
            if out_dir is None:
                continue
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / filename).write_text(fn(result))
        written.append(out_dir / filename)
        if name == "csv":
            (out_dir / "training_cost.csv").write_text(render.render_cost_csv(result))
            written.append(out_dir / "training_cost.csv")
    if out_dir is not None and figures:
        from .figures import write_figures

        pngs, warnings = write_figures(result, out_dir / "figures")
        for w in warnings:
            _warn(err, w)
        written += pngs
    if written:
        err.print(f"{len(result.runs)} runs; wrote {len(written)} files to {out_dir}: "
                  + ", ".join(str(p.relative_to(out_dir)) for p in written),
                  highlight=False, soft_wrap=True)
