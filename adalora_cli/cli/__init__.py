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
from rich.markup import escape
from rich.table import Table

from .. import threads
from ..config import ConfigError, load_config

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="AdaLoRA and its baselines (Zhang et al., ICLR 2023): train, sweep, report, "
         "export, eval, predict.",
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
    # escape: a message may quote config text such as log.to=[wandb], not Rich markup
    if os.environ.get("RANK", "0") == "0":  # under torchrun one line, not one per rank
        err().print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _debug() -> bool:
    return os.environ.get("ADALORA_DEBUG", "") not in ("", "0")


EXIT_FAILED, EXIT_USAGE, EXIT_BUSY, EXIT_PREEMPTED = 1, 2, 73, 75
"""Exit codes: 73 (EX_CANTCREAT) another live process owns the run; 75 (EX_TEMPFAIL) the
run stopped on a signal with a checkpoint and can be resumed."""


@app.command(context_settings={"allow_extra_args": False})
def train(
    config: str | None = typer.Argument(
        None, help="YAML config, e.g. configs/glue/rte.yaml (omit with --resume)"),
    overrides: list[str] | None = typer.Argument(
        None, help="key=value overrides with dotted keys, e.g. method.name=lora lora.r=8"),
    run_dir: Path | None = typer.Option(
        None, "--run-dir", help="Output directory (default: runs/<task>-<method>-s<seed>-<time>); "
                                "must not hold an earlier run."),
    resume: Path | None = typer.Option(
        None, "--resume", help="Continue this unfinished run directory from its latest "
                               "checkpoint (its own config; only where-and-how overrides "
                               "such as train.save_every or train.device are accepted)."),
    dry_run: bool = typer.Option(
        False, "--dry-run",
        help="Build model and method, print the parameter table, train nothing."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    nproc: int = typer.Option(
        1, "--nproc", help="Processes (GPUs) for this one run, launched with torchrun; "
                           "train.batch_size stays the global batch."),
) -> None:
    """Fine-tune one model with one method on one task and write a run directory.

    Checkpoints go to RUN_DIR/checkpoints every train.save_every steps and on SIGTERM or
    SIGUSR1 (the run is then marked preempted, exit code 75); `adalora train --resume RUN_DIR`
    continues it exactly where it stopped."""
    from ..engine import build, loop  # heavy imports only once the arguments parse
    from ..rundir.owner import die_with_parent
    from ..rundir.run import RunBusy

    die_with_parent()  # started by a sweep: stop (with a checkpoint) if the sweep dies
    _quiet_libraries()
    extra = list(overrides or [])
    if nproc < 1:
        _fail(f"--nproc must be >= 1, got {nproc}", EXIT_USAGE)
    try:
        if resume is not None:
            if run_dir is not None or dry_run:
                raise ConfigError("--resume continues an existing run: drop --run-dir and "
                                  "--dry-run")
            if config is not None:  # `train --resume DIR key=value`: no config is taken
                if "=" not in config:
                    raise ConfigError(f"--resume takes its config from {resume}; drop "
                                      f"{config!r} (only key=value overrides may follow)")
                extra.insert(0, config)
            from ..config import resume_config
            from ..rundir.layout import CONFIG

            loop.RunDir.check_claimable(resume)
            cfg = resume_config(resume / CONFIG, extra)
            if nproc != 1:
                code = _launch_ranks(nproc, cfg)
            else:
                path = loop.resume(resume, cfg, quiet=quiet, note=_note)
        else:
            if config is None:
                raise ConfigError("pass a config (adalora train configs/glue/rte.yaml) or "
                                  "--resume RUN_DIR")
            cfg = load_config(config, extra)
            if dry_run:
                _print_dry_run(build.dry_run(cfg))
                return
            if nproc != 1:
                code = _launch_ranks(nproc, cfg)
            else:
                path = loop.train(cfg, run_dir, quiet=quiet)
    except ConfigError as e:
        if _debug():
            raise
        _fail(str(e), EXIT_USAGE)
    except RunBusy as e:
        _fail(f"{e}; wait for it, or stop that process first", EXIT_BUSY)
    except loop.Preempted as e:
        where = getattr(e, "run_dir", None)
        _fail(f"{e}" if where else f"{e} before the run started; nothing was written",
              EXIT_PREEMPTED)
    except KeyboardInterrupt as e:
        where = getattr(e, "run_dir", None)
        _fail("interrupted; the run directory is marked failed"
              + (f" (resume it with adalora train --resume {where})" if where else ""), 130)
    except Exception as e:  # a run that broke mid-way: one line, the directory says failed
        if _debug():
            raise
        where = getattr(e, "run_dir", None)
        suffix = f" (run directory marked failed: {where})" if where else ""
        _fail(f"{type(e).__name__}: {build.first_line(e)}{suffix}; "
              "rerun with ADALORA_DEBUG=1 for the traceback", EXIT_FAILED)
    if nproc != 1:
        raise typer.Exit(code)  # each rank said what there was to say
    if os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 speaks for the run
        _print_result(path)


def _note(text: str) -> None:
    if os.environ.get("RANK", "0") == "0":
        err().print(f"[yellow]note:[/] {text}", highlight=False, soft_wrap=True)


def _launch_ranks(nproc: int, cfg) -> int:
    """``adalora train ... --nproc N``: the same command on N processes (one machine; for
    several machines call torchrun yourself with ``-m adalora_cli``)."""
    from ..engine.distributed import World, per_rank_batch
    from ..engine.launch import launch

    if os.environ.get("WORLD_SIZE"):
        raise ConfigError("--nproc is for launching; under torchrun drop it (torchrun sets "
                          "the ranks)")
    per_rank_batch(cfg.train.batch_size, World(0, nproc, 0))  # refused before any launch
    args, skip = [], False
    for arg in sys.argv[2:]:  # `adalora train ...` without --nproc N
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            args.append(arg)
    return launch(nproc, ["train", *args])


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
    if "final_budget" in info:  # issue 10: AdaLoRA trains at r0 but keeps only b(T)
        _print_final_budget(console, info)
    print(json.dumps(info), flush=True)  # last line: machine-readable


def _print_final_budget(console: Console, info: dict) -> None:
    lo, hi, even = (info["final_params_min"], info["final_params_max"],
                    info["final_params_uniform"])
    kept = f"{lo:,}" if lo == hi else f"{lo:,} to {hi:,} by rank pattern"
    if even is not None and lo != hi:
        rank = info["final_budget"] // info["n_matrices"]
        kept += f", {even:,} if every matrix ends at rank {rank}"
    console.print(f"trains at r0: {info['adapter_params_at_r0']:,} adapter params; b(T) = "
                  f"{info['final_budget']} keeps {kept}", highlight=False, soft_wrap=True)


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
    # launchers and --status (issue 9)
    launcher_name: str = typer.Option(
        "local", "--launcher", help="local (processes on this machine) or slurm (one "
                                    "submitit job array, one run per task)"),
    slurm: list[str] | None = typer.Option(
        None, "--slurm", help="SLURM job options, e.g. partition=gpu,time=24:00:00,"
                              "gpus_per_job=1; also cpus, mem, account, qos, constraint, "
                              "parallel, signal_delay, requeues, sbatch.<flag>=<value>"),
    status: bool = typer.Option(
        False, "--status", help="Print every run's state (run directories and the "
                                "scheduler); submit and train nothing."),
    wait: bool = typer.Option(
        False, "--wait", help="With --launcher slurm: block until the submitted jobs end."),
) -> None:
    """Run a grid of configs x methods x budgets x seeds, one `adalora train` per run.

    Re-running the same sweep skips finished runs and resumes unfinished ones from their
    checkpoints; two sweeps on one sweep directory share the runs. On SLURM it submits
    only what is not finished, running or queued."""
    from ..sweep import plan as sweeps
    from ..sweep.launch import make_launcher
    from ..sweep.local import SweepStopped, describe

    _quiet_libraries()
    try:
        launcher = make_launcher(launcher_name, slurm, jobs, wait)  # issue 9
        spec = sweeps.build_spec(source, budget, methods, seeds, overrides or [])
        runs = sweeps.plan(spec)
        where = sweep_dir or Path("runs") / spec.name
        if where.exists() and not where.is_dir():
            raise ConfigError(f"--sweep-dir {where} is a file; pass a folder (it is created "
                              "if missing)")
        if dry_run:
            _print_sweep_plan(describe(runs, where), where)
            return
        if status:  # issue 9
            from ..sweep.show import print_status
            from ..sweep.status import check_sweep_dir, sweep_states

            check_sweep_dir(where)
            print_status(sweep_states(runs, where), where, out())
            return
        outcomes = launcher.launch(spec, runs, where, quiet=quiet)
    except ConfigError as e:
        if _debug():
            raise
        _fail(str(e), 2)
    except OSError as e:
        if _debug():
            raise
        _fail(_os_error(e), 1)
    except (KeyboardInterrupt, SweepStopped) as e:
        why = "stopped by SIGTERM" if isinstance(e, SweepStopped) else "interrupted"
        _fail(f"{why}; running runs were checkpointed and are resumed when the sweep is "
              "started again", 130 if isinstance(e, KeyboardInterrupt) else 143)
    if launcher.name == "slurm":  # issue 9
        from ..sweep.show import print_submitted

        print_submitted(outcomes, where, out())
        if any(o.status == "failed" for o in outcomes):
            raise typer.Exit(1)
        return
    counts = {s: sum(o.status == s for o in outcomes)
              for s in ("finished", "skipped", "busy", "preempted", "failed")}
    out().print(f"{len(outcomes)} runs: {counts['finished']} finished now, {counts['skipped']} "
                f"finished earlier (skipped), {counts['busy']} running elsewhere, "
                f"{counts['preempted']} preempted, {counts['failed']} failed; sweep "
                f"directory: {where}", highlight=False, soft_wrap=True)
    for o in outcomes:
        if o.status in ("failed", "preempted"):
            err().print(f"{o.status}: {o.run.name}: {o.error} (log: {where}/logs/"
                        f"{o.run.name}.log); rerun the sweep to resume it",
                        highlight=False, soft_wrap=True)
    if counts["failed"] or counts["preempted"]:
        raise typer.Exit(1)


def _os_error(e: OSError) -> str:
    """One line for a file-system error: what failed, on which path."""
    where = f" ({e.filename})" if e.filename else ""
    return f"{e.strerror or type(e).__name__}{where}; check the path and free disk space"


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
    eval_name: str | None = typer.Option(
        None, "--eval", help="Show the scores of `adalora eval ... --name NAME` "
                             "(eval/NAME.json) instead of the training's"),
) -> None:
    """Tables (paper Tables 1-3, 9) and figures (3-5) from finished run directories."""
    from ..report.render import FORMATS
    from ..report.tables import build_report

    try:
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
        result = build_report(list(paths), show_paper=paper, eval_name=eval_name)
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
    except OSError as e:
        if _debug():
            raise
        _fail(_os_error(e), 1)


def _emit_report(result, formats: list[str], out_dir: Path | None, figures: bool) -> None:
    from ..report import render as render

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
        from ..report.figures import write_figures

        pngs, warnings = write_figures(result, out_dir / "figures")
        for w in warnings:
            err().print(f"[yellow]warning:[/] {w}", highlight=False, soft_wrap=True)
        written += pngs
    if written:
        err().print(f"{len(result.runs)} runs; wrote {len(written)} files to {out_dir}: "
                    + ", ".join(str(p.relative_to(out_dir)) for p in written),
                    highlight=False, soft_wrap=True)


# ------------------------------------------------------------------- export / eval / predict
# (issue 10: appended; the existing commands above are unchanged)


def _run_guarded(action):
    """Run ``action()``; a ConfigError is one line and exit 2, anything else one line and 1."""
    try:
        return action()
    except ConfigError as e:
        if _debug():
            raise
        _fail(str(e), 2)
    except KeyboardInterrupt:
        _fail("interrupted; nothing was left half-written", 130)
    except Exception as e:
        if _debug():
            raise
        first = (str(e).strip().splitlines() or [""])[0]
        _fail(f"{type(e).__name__}: {first}; rerun with ADALORA_DEBUG=1 for the traceback", 1)


@app.command(context_settings={"allow_extra_args": False})
def export(
    run_dir: Path = typer.Argument(..., help="A finished run directory"),
    out_dir: Path = typer.Argument(..., help="New folder to write (must not exist)"),
    fmt: str = typer.Option("peft", "--format", "-f",
                            help="peft (PeftModel.from_pretrained loads it) or merged (Delta W "
                                 "folded into the weights: a plain transformers model)"),
) -> None:
    """Export a trained run as a PEFT adapter or a merged transformers model."""
    from ..artifacts.export import export_run

    _quiet_libraries()
    info = _run_guarded(lambda: export_run(run_dir, fmt, out_dir))
    console = out()
    if info["format"] == "peft":
        kept = info["adapter_params"]
        at_r0 = info["adapter_params_at_r0"]
        note = f" (of {at_r0:,} at r0)" if kept != at_r0 else ""
        console.print(f"PEFT {info['task_type'] or ''} adapter: {kept:,} adapter params{note}, "
                      f"{info['head_params']:,} head params, {info['bytes']:,} bytes",
                      highlight=False, soft_wrap=True)
    else:
        console.print(f"merged {info['merged_matrices']} matrices into a "
                      f"{info['model_class']}: {info['bytes']:,} bytes", highlight=False,
                      soft_wrap=True)
    console.print(f"wrote {out_dir}", highlight=False)


@app.command("eval", context_settings={"allow_extra_args": False})
def eval_run(
    run_dir: Path = typer.Argument(..., help="A finished run directory"),
    overrides: list[str] | None = typer.Argument(
        None, help="task.* overrides, e.g. task.data_files.validation=my_dev.tsv"),
    name: str | None = typer.Option(
        None, "--name", help="Result name: eval/<name>.json (default: the data file's stem, "
                             "or 'default' for the task's own evaluation splits)"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress lines."),
) -> None:
    """Score a finished run again, on its evaluation splits or on other data.

    Writes eval/<name>.json in the run directory; the training results stay as they were."""
    from ..artifacts.rescore import rescore

    _quiet_libraries()
    path = _run_guarded(lambda: rescore(run_dir, overrides or [], name, quiet=quiet))
    result = json.loads(path.read_text())
    console = out()
    for split, metrics in result["metrics"].items():
        shown = "  ".join(f"{k} {v:.4f}" for k, v in metrics.items())
        console.print(f"{split}: {shown}", highlight=False)
    console.print(f"wrote {path}", highlight=False, soft_wrap=True)


@app.command("predict", context_settings={"allow_extra_args": False})
def predict_cmd(
    run_dir: Path = typer.Argument(..., help="A finished run directory"),
    input_path: Path = typer.Option(..., "--input", "-i",
                                    help="jsonl/csv/tsv/json/parquet in the task's columns"),
    output_path: Path = typer.Option(..., "--output", "-o", help="jsonl to write (new file)"),
    batch_size: int = typer.Option(32, "--batch-size", help="Rows per batch"),
    device: str = typer.Option("cpu", "--device", help="cpu, cuda, cuda:1, ..."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """Labels and scores (classification), answers (QA) or summaries, one JSON line per row."""
    from ..artifacts.predict import predict

    _quiet_libraries()
    n = _run_guarded(lambda: predict(run_dir, input_path, output_path, batch_size=batch_size,
                                     device=device, quiet=quiet))
    out().print(f"wrote {n} predictions to {output_path}", highlight=False, soft_wrap=True)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
