"""``adalora report``'s work between parsing and printing: check the arguments, read the run
directories, then print the tables and write the requested files and figures."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console

from ..config import ConfigError
from ..errors import warning, write_failed


def run_report(paths: list[Path], fmt: str, out_dir: Path | None, *, paper: bool,
               figures: bool, eval_name: str | None, out: Console, err: Console,
               min_seeds: int = 1, against: str | None = None,
               per_seed: bool = False) -> None:
    """``fmt``: one of render.FORMATS, several joined by commas, or ``all``. Skipped runs
    and left-out runs are warnings on ``err``; no finished run at all is a ConfigError.
    ``against``: the method the others are tested against (None: LoRA, silently absent);
    one named but not among the finished runs is a ConfigError."""
    from ..methods.registry import METHODS
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
    if out_dir is not None:
        check_out_dir(out_dir)
    if min_seeds < 1:
        raise ConfigError(f"--min-seeds {min_seeds} must be at least 1")
    if against is not None and against not in METHODS:
        raise ConfigError(f"unknown --against {against!r}; choose a method name: "
                          f"{', '.join(METHODS)}")
    result = build_report(list(paths), show_paper=paper, eval_name=eval_name,
                          min_seeds=min_seeds, against=against or "lora",
                          per_seed=per_seed)
    for path, reason in result.skipped:
        _warn(err, f"skipped {path}: {reason}")
    for note in result.notes:
        _warn(err, note)
    if not result.runs:
        raise ConfigError(f"no finished runs under {', '.join(map(str, paths))}"
                          + "".join(_searching(t) for t in result.tunes[:1]))
    methods = sorted({r.method for r in result.runs})
    if against is not None and against not in methods:
        raise ConfigError(f"--against {against}: no finished {against} runs under "
                          f"{', '.join(map(str, paths))} to compare with; the methods there: "
                          f"{', '.join(methods)}")
    emit(result, formats, out_dir, figures, out, err)


def _searching(tune) -> str:
    """Why a tune still mid-search has nothing to report: its trials are the search, and
    the report's results are the seed runs of the values it chooses."""
    from ..rundir.run import RunDir

    cells = tune.data["cells"]
    # read from the trials' run directories: the study is told a trial later
    ended = sum((RunDir.read_status(run) or {}).get("status") in ("finished", "pruned")
                for run in tune.trial_dirs())
    planned = sum(c.get("trials_planned") or 0 for c in cells)
    command = f"adalora tune {tune.data.get('source', 'MANIFEST')} --status"
    if tune.path.resolve() != (Path("runs") / tune.data.get("name", "")).resolve():
        command += f" --sweep-dir {tune.path}"
    return (f": {tune.path} is a tune whose seed runs have not finished ({ended} of {planned} "
            "trials of its search ended; its results are the seed runs of the values it "
            f"chooses); see where it stands with {command}")


def check_out_dir(out_dir: Path) -> None:
    """Refuse an ``--out`` that is a file, or lies under one, before anything is printed."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"--out {out_dir} is a file; pass a folder for the report "
                          "(it is created if missing)")
    above = next((p for p in out_dir.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise ConfigError(f"--out {out_dir} lies under {above}, which is a file; pass a "
                          "folder for the report (it is created if missing)")


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
    files: dict[str, str] = {}
    shown = False
    for name in formats:
        if name == "rich":
            continue
        filename, fn = texts[name]
        if out_dir is None or (not shown and "rich" not in formats):
            print(fn(result))
            shown = True
            if out_dir is None:
                continue
        files[filename] = fn(result)
        if name == "csv":
            files["training_cost.csv"] = render.render_cost_csv(result)
    if out_dir is None or not (files or figures):
        return
    written = write_files(out_dir, files, result if figures else None, err)
    if written:
        err.print(f"{len(result.runs)} runs; wrote {len(written)} files to {out_dir}: "
                  + ", ".join(str(p.relative_to(out_dir)) for p in written),
                  highlight=False, soft_wrap=True)


def write_files(out_dir: Path, texts: dict[str, str], figures_of, err: Console) -> list[Path]:
    """Write ``texts`` ({file name: text}) and, given a report, its figures into ``out_dir``.

    Everything is written into a hidden folder inside ``out_dir`` first and renamed into
    place only when all of it was written, so a full disk leaves the folder as it was (an
    earlier report included), never a truncated report.md or an empty PNG; the error names
    the file that could not be written."""
    created = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".report.partial-", dir=out_dir))
    published = False
    try:
        made: list[Path] = []
        for filename, text in texts.items():
            with _naming(out_dir, staging, staging / filename):
                (staging / filename).write_text(text)
            made.append(staging / filename)
        if figures_of is not None:
            from .figures import write_figures

            with _naming(out_dir, staging, staging / "figures"):
                pngs, warnings = write_figures(figures_of, staging / "figures")
            for w in warnings:
                _warn(err, w)
            made += pngs
        final = [out_dir / p.relative_to(staging) for p in made]
        for src, dest in zip(made, final):  # renames: they need no space
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, dest)
        published = True
        return final
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if created and not published and not any(out_dir.iterdir()):
            out_dir.rmdir()  # made for this report, which failed: not left behind empty


@contextmanager
def _naming(out_dir: Path, staging: Path, path: Path) -> Iterator[None]:
    """Say a failed write as the file it was for (its final name) and the system's reason;
    a figure names its own file (the one being written when the error came)."""
    try:
        yield
    except OSError as err:
        where = Path(err.filename) if err.filename else path
        if staging in where.parents or where == staging:
            where = out_dir / where.relative_to(staging)
        raise write_failed(where, err) from None
