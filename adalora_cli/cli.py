"""``adalora`` command line: parse, call one function, say where the results went.

User errors (bad config, missing files, impossible schedules) print one line starting
with ``error:`` and exit 2; a run that breaks while training exits 1 with one line and
leaves its directory marked failed. ``ADALORA_DEBUG=1`` shows the full traceback.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from . import threads
from .config import ConfigError, load_config

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="AdaLoRA and its baselines (Zhang et al., ICLR 2023): train, sweep, report.",
)


def out() -> Console:  # made per call so redirected or captured streams are honoured
    return Console()


def err() -> Console:
    return Console(stderr=True)


def _quiet_libraries() -> None:
    """Our progress bar and one-line errors only: silence the libraries' load reports,
    per-map progress bars and advisory warnings (real errors still raise)."""
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    import datasets
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    datasets.utils.logging.set_verbosity_error()
    datasets.disable_progress_bars()


@app.callback()
def main() -> None:
    """AdaLoRA experiment runner."""
    threads.apply_defaults()  # before torch loads: OpenMP reads its settings once


def _fail(message: str, code: int) -> None:
    err().print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _debug() -> bool:
    return os.environ.get("ADALORA_DEBUG", "") not in ("", "0")


@app.command(context_settings={"allow_extra_args": False})
def train(
    config: Path = typer.Argument(..., help="YAML config, e.g. configs/glue/rte.yaml"),
    overrides: list[str] | None = typer.Argument(
        None, help="key=value overrides with dotted keys, e.g. method.name=lora lora.r=8"),
    run_dir: Path | None = typer.Option(
        None, "--run-dir", help="Output directory (default: runs/<task>-<method>-s<seed>-<time>); "
                                "must not hold an earlier run."),
    dry_run: bool = typer.Option(
        False, "--dry-run",
        help="Build model and method, print the parameter table, train nothing."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """Fine-tune one model with one method on one task and write a run directory."""
    from . import train as training  # heavy imports only once the arguments parse

    _quiet_libraries()
    try:
        cfg = load_config(config, overrides or [])
        if dry_run:
            _print_dry_run(training.dry_run(cfg))
            return
        path = training.train(cfg, run_dir, quiet=quiet)
    except ConfigError as e:
        if _debug():
            raise
        _fail(str(e), 2)
    except KeyboardInterrupt:
        _fail("interrupted; the run directory is marked failed", 130)
    except Exception as e:  # a run that broke mid-way: one line, the directory says failed
        if _debug():
            raise
        where = getattr(e, "run_dir", None)
        suffix = f" (run directory marked failed: {where})" if where else ""
        _fail(f"{type(e).__name__}: {training.first_line(e)}{suffix}; "
              "rerun with ADALORA_DEBUG=1 for the traceback", 1)
    _print_result(path)


def _print_dry_run(result: dict) -> None:
    table = Table(title="adapter modules", show_lines=False)
    table.add_column("module", overflow="fold")
    table.add_column("kind")
    table.add_column("adapter params", justify="right")
    table.add_column("trainable", justify="right")
    for row in result["table"]:
        table.add_row(row["module"], row["kind"], f"{row['adapter_params']:,}",
                      f"{row['trainable']:,}")
    console = out()
    console.print(table)
    info = result["info"]
    console.print(f"adapter params (the paper's # Params): {info['adapter_params']:,}  "
              f"head params: {info['head_params']:,}  matrices: {info['n_matrices']}")
    print(json.dumps(info), flush=True)  # last line: machine-readable


def _print_result(path: Path) -> None:
    summary = json.loads((path / "summary.json").read_text())
    console = out()
    for split, metrics in summary["metrics"].items():
        shown = "  ".join(f"{k} {v:.4f}" for k, v in metrics.items())
        console.print(f"{split}: {shown}")
    console.print(f"run directory: {path}")


# --------------------------------------------------------------------------- sweep / report


@app.command(context_settings={"allow_extra_args": False})
def sweep(
    source: Path = typer.Argument(
        ..., help="A config (configs/glue/rte.yaml) or a manifest (experiments/table1_glue.yaml)"),
    overrides: list[str] | None = typer.Argument(
        None, help="key=value overrides applied to every run"),
    budget: str | None = typer.Option(
        None, "--budget", help="AdaLoRA final budgets b(T), e.g. 144,288,576; every other "
                               "method gets the matching size (SPEC section 7)"),
    methods: str | None = typer.Option(
        None, "--methods", help="e.g. adalora,lora,houlsby,pfeiffer,bitfit,full "
                                "(default: the config's method)"),
    seeds: str | None = typer.Option(None, "--seeds", help="e.g. 0,1,2 (default: the config's)"),
    jobs: int = typer.Option(1, "--jobs", "-j", help="Runs at once (one GPU each when several "
                                                     "are visible)"),
    sweep_dir: Path | None = typer.Option(
        None, "--sweep-dir", help="Where the run directories go (default: runs/<sweep name>)"),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="List the runs with their parameter counts; train nothing."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress display."),
) -> None:
    """Run a grid of configs x methods x budgets x seeds, one `adalora train` per run.

    Re-running the same sweep skips finished runs and reruns unfinished ones."""
    from . import sweep as sweeps
    from .sweep_runner import describe, execute

    _quiet_libraries()
    try:
        if jobs < 1:
            raise ConfigError(f"--jobs must be >= 1, got {jobs}")
        spec = sweeps.build_spec(source, budget, methods, seeds, overrides or [])
        runs = sweeps.plan(spec)
        where = sweep_dir or Path("runs") / spec.name
        if dry_run:
            _print_sweep_plan(describe(runs, where), where)
            return
        outcomes = execute(spec, runs, where, jobs=jobs, quiet=quiet)
    except ConfigError as e:
        if _debug():
            raise
        _fail(str(e), 2)
    except KeyboardInterrupt:
        _fail("interrupted; unfinished runs are rerun when the sweep is started again", 130)
    counts = {s: sum(o.status == s for o in outcomes)
              for s in ("finished", "skipped", "busy", "failed")}
    out().print(f"{len(outcomes)} runs: {counts['finished']} finished now, {counts['skipped']} "
                f"finished earlier (skipped), {counts['busy']} running elsewhere, "
                f"{counts['failed']} failed; sweep directory: {where}", highlight=False,
                soft_wrap=True)
    for o in outcomes:
        if o.status == "failed":
            err().print(f"failed: {o.run.name}: {o.error} (log: {where}/logs/{o.run.name}.log)",
                        highlight=False, soft_wrap=True)
    if counts["failed"]:
        raise typer.Exit(1)


def _print_sweep_plan(rows: list[dict], where: Path) -> None:
    table = Table(title=f"sweep plan ({where})")
    for name in ("run", "method", "b(T)", "size", "seed", "adapter params", "trainable",
                 "action"):
        table.add_column(name, overflow="fold",
                         justify="right" if name in ("adapter params", "trainable") else "left")
    for r in rows:
        table.add_row(r["run"], r["method"], str(r["budget_level"] or ""), r["size"],
                      str(r["seed"]), f"{r['adapter_params']:,}", f"{r['trainable_params']:,}",
                      r["action"])
    out().print(table)
    todo = sum(r["action"].startswith(("run", "rerun")) for r in rows)
    out().print(f"{len(rows)} runs planned, {todo} would run; nothing was trained")


@app.command(context_settings={"allow_extra_args": False})
def report(
    paths: list[Path] = typer.Argument(..., help="Run directories, or folders holding them "
                                                 "at any depth (e.g. runs/)"),
    fmt: str = typer.Option("rich", "--format", "-f",
                            help="rich, markdown, csv, latex, or several: markdown,csv; all"),
    out_dir: Path | None = typer.Option(
        None, "--out", help="Write the report files and figures (PNG) into this folder"),
    paper: bool = typer.Option(False, "--paper", help="Show the paper's numbers beside ours, "
                                                      "with the difference"),
    figures: bool = typer.Option(True, "--figures/--no-figures", help="Figures (with --out)"),
) -> None:
    """Tables (paper Tables 1-3, 9) and figures (3-5) from finished run directories."""
    from .report import build_report
    from .report_render import FORMATS

    try:
        formats = list(FORMATS) if fmt == "all" else [f.strip() for f in fmt.split(",")]
        bad = [f for f in formats if f not in FORMATS]
        if bad:
            raise ConfigError(f"unknown --format {bad[0]!r}; choose from "
                              f"{', '.join(FORMATS)} or all")
        missing = [p for p in paths if not p.exists()]
        if missing:
            raise ConfigError(f"{missing[0]} does not exist; pass run directories or runs/")
        result = build_report(list(paths), show_paper=paper)
        for path, reason in result.skipped:
            err().print(f"[yellow]warning:[/] skipped {path}: {reason}", highlight=False,
                        soft_wrap=True)
        for note in result.duplicates:
            err().print(f"[yellow]warning:[/] {note}", highlight=False, soft_wrap=True)
        if not result.runs:
            raise ConfigError(f"no finished runs under {', '.join(map(str, paths))}")
        _emit_report(result, formats, out_dir, figures)
    except ConfigError as e:
        if _debug():
            raise
        _fail(str(e), 2)


def _emit_report(result, formats: list[str], out_dir: Path | None, figures: bool) -> None:
    from . import report_render as render

    texts = {"markdown": ("report.md", render.render_markdown),
             "latex": ("report.tex", render.render_latex),
             "csv": ("results.csv", render.render_csv)}
    if "rich" in formats:
        render.render_rich(result, out())
    written = []
    for name in formats:
        if name == "rich":
            continue
        filename, fn = texts[name]
        if out_dir is None:
            print(fn(result))
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
            err().print(f"[yellow]warning:[/] {w}", highlight=False, soft_wrap=True)
        written += pngs
    if written:
        err().print(f"{len(result.runs)} runs; wrote {len(written)} files to {out_dir}: "
                    + ", ".join(str(p.relative_to(out_dir)) for p in written),
                    highlight=False, soft_wrap=True)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
