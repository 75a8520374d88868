"""``adalora train``: one model, one method, one task -> one run directory."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table

from .boundary import boundary, note, out, quiet_libraries, rank0

if TYPE_CHECKING:
    from ..engine.dryrun import DryRun, FinalBudget
    from ..rundir.summary import Summary


def train(
    config: str | None = typer.Argument(
        None, help="YAML config, e.g. configs/glue/rte.yaml (omit with --resume)"),
    overrides: list[str] | None = typer.Argument(
        None, metavar="KEY=VALUE",
        help="Overrides of the config's keys, dotted, e.g. method.name=lora lora.r=8"),
    run_dir: Path | None = typer.Option(
        None, "--run-dir", help="Output directory (default: runs/<task>-<method>-s<seed>-<time>); "
                                "must not hold an earlier run."),
    resume: Path | None = typer.Option(
        None, "--resume", metavar="RUN_DIR",
        help="Continue this unfinished run directory from its latest checkpoint (its own "
             "config; only where-and-how overrides such as train.save_every or train.device "
             "are accepted)."),
    dry_run: bool = typer.Option(
        False, "--dry-run",
        help="Build model and method, print the parameter table, train nothing."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    nproc: int = typer.Option(
        1, "--nproc", help="Processes (GPUs) for this one run, launched with torchrun; "
                           "train.batch_size stays the global batch."),
) -> None:
    """Fine-tune one model with one method on one task and write a run directory.

    CONFIG is a YAML file (`adalora configs` lists the shipped ones and copies one to edit).
    Checkpoints go to RUN_DIR/checkpoints every train.save_every steps and on SIGTERM or
    SIGUSR1 (the run is then marked preempted, exit code 75); `adalora train --resume RUN_DIR`
    continues it exactly where it stopped.

    Examples:
      adalora train configs/demo/rotten_tomatoes.yaml
      adalora train configs/glue/rte.yaml method.name=lora lora.r=8
      adalora train configs/smoke/glue.yaml --dry-run
      adalora train --resume runs/rte-adalora-s0-...

    Docs: docs/training.md"""
    from ..engine.command import TrainRequest, run_train
    from ..rundir.owner import die_with_parent

    die_with_parent()  # started by a sweep: stop (with a checkpoint) if the sweep dies
    quiet_libraries()
    request = TrainRequest(config, list(overrides or []), run_dir, resume, dry_run, quiet,
                           nproc, argv=sys.argv[2:])
    with boundary(interrupted="interrupted; the run directory is marked failed"):
        check_harness(request)  # eval.harness: refused before anything trains
        outcome = run_train(request, note=note)
    if outcome.exit_code is not None:
        raise typer.Exit(outcome.exit_code)  # each rank said what there was to say
    if outcome.dry_run is not None:
        print_dry_run(outcome.dry_run)
    elif rank0():  # under torchrun, rank 0 speaks for the run
        print_result(outcome.run_dir)
        harness_after(outcome.run_dir, quiet)


def check_harness(request) -> None:
    """A config's ``eval.harness`` that could not run after training (no lm-eval, an unknown
    task, a run that is no decoder's) is refused before the run starts."""
    from ..config import ConfigError, load_config, resume_config
    from ..rundir.layout import CONFIG

    try:
        if request.resume is not None:
            extra = [request.config] if request.config and "=" in request.config else []
            cfg = resume_config(request.resume / CONFIG, extra + list(request.overrides))
        elif request.config is not None:
            cfg = load_config(request.config, request.overrides)
        else:
            return
    except ConfigError:
        return  # a config that cannot be read: run_train says so, in its own order
    if not cfg.eval.harness:
        return  # (torch loads after the run's header, not here)
    from ..artifacts.harness import check_config

    check_config(cfg, "eval.harness")


def harness_after(run_dir: Path, quiet: bool) -> None:
    """``eval.harness``: the finished run scored by lm-evaluation-harness (with
    ``train.eval_at_start``, its base model too), each score beside the run's own."""
    from ..artifacts.harness import lines, score_run
    from ..config import load_config
    from ..rundir.layout import CONFIG, HARNESS

    cfg = load_config(run_dir / CONFIG)
    if not cfg.eval.harness:
        return
    with boundary(interrupted=f"interrupted; the run {run_dir} itself finished"):
        scored = score_run(run_dir, limit=cfg.eval.harness_limit,
                           base=cfg.train.eval_at_start, quiet=quiet)
    console = out()
    for line in lines(run_dir, scored):
        console.print(line, highlight=False, soft_wrap=True)
    console.print(f"harness scores: {run_dir / HARNESS}", highlight=False, soft_wrap=True)


def print_dry_run(result: DryRun) -> None:
    table = Table(title="adapter modules", show_lines=False)
    table.add_column("module", overflow="fold")
    table.add_column("kind")
    table.add_column("adapter params", justify="right")
    table.add_column("trainable", justify="right")
    for row in result.table:
        table.add_row(row.module, row.kind, f"{row.adapter_params:,}", f"{row.trainable:,}")
    console = out()
    console.print(table)
    console.print(f"adapter params (the paper's # Params): {result.adapter_params:,}  "
                  f"head params: {result.head_params:,}  matrices: {result.n_matrices}",
                  highlight=False, soft_wrap=True)
    if result.budget is not None:  # AdaLoRA trains at r0 but keeps only b(T): show both
        _print_final_budget(console, result.budget, result.n_matrices)
    if result.ranks_at_start:
        from ..methods.registry import PASS_NOTE

        console.print(f"{result.method}: {PASS_NOTE}", highlight=False, soft_wrap=True)
    print(json.dumps(result.info()), flush=True)  # last line: machine-readable


def _print_final_budget(console: Console, budget: FinalBudget, n: int) -> None:
    lo, hi, even = budget.final_params_min, budget.final_params_max, budget.final_params_uniform
    kept = f"{lo:,}" if lo == hi else f"{lo:,} to {hi:,} by rank pattern"
    if even is not None and lo != hi:
        kept += f", {even:,} if every matrix ends at rank {budget.final_budget // n}"
    console.print(f"trains at r0: {budget.adapter_params_at_r0:,} adapter params; b(T) = "
                  f"{budget.final_budget} keeps {kept}", highlight=False, soft_wrap=True)
    console.print(f"mean final rank b(T)/n = {budget.final_budget}/{n} = "
                  f"{budget.final_mean_rank:g}", highlight=False, soft_wrap=True)


def print_result(path: Path) -> None:
    """The final scores, what the run cost and trained, and where it is."""
    from ..rundir.summary import read_summary
    from ..tasks.columns import metrics_line

    summary = read_summary(path)
    console = out()
    # train.eval_at_start: the scores before training, beside the trained ones
    for split, metrics in (summary.metrics_at_start or {}).items():
        console.print(f"{split} before training: {metrics_line(metrics)}", highlight=False,
                      soft_wrap=True)
    if summary.selected:  # train.select=best: the scores below are the chosen step's
        console.print(selected_line(summary), highlight=False, soft_wrap=True)
    for split, metrics in summary.metrics.items():
        console.print(f"{split}: {metrics_line(metrics)}", highlight=False)
    console.print(end_of_run(summary), highlight=False)
    console.print(f"run directory: {path}", highlight=False)


def selected_line(s: Summary) -> str:
    """``selected step 8 (best: validation/loss 5.64144); early stopping ended training at
    step 12``."""
    chosen = s.selected or {}
    value = chosen.get("value")
    shown = "n/a" if value is None else f"{value:.6g}"
    line = (f"selected step {chosen.get('step')} ({chosen.get('from')}: "
            f"{chosen.get('split')}/{chosen.get('metric')} {shown})")
    if chosen.get("stopped_early_at") is not None:
        line += f"; early stopping ended training at step {chosen['stopped_early_at']}"
    return line


def end_of_run(s: Summary) -> str:
    """``32 steps in 0:00:04 on cpu, peak memory 312 MiB; trained 3,266 parameters (3,200
    adapter + 66 head); final mean rank 1.33 (b(T) 16 over 12 matrices)``; with a step
    chosen before the end (train.select=best), the steps run and that step's ranks."""
    from ..engine.progress import clock_text

    chosen = s.selected or {}
    ran = chosen.get("stopped_early_at")
    steps = f"{ran} of {s.total_steps}" if ran is not None else f"{s.total_steps}"
    parts = [f"{steps} steps in {clock_text(s.train_seconds or 0)} on {s.device}"]
    if s.peak_memory_bytes:
        parts[0] += f", peak memory {s.peak_memory_bytes / 2**20:,.0f} MiB"
    if s.trainable_params is not None:
        parts.append(f"trained {s.trainable_params:,} parameters ({s.adapter_params:,} "
                     f"adapter + {s.head_params:,} head)")
    if s.final_mean_rank is not None and chosen.get("from") == "best":
        parts.append(f"mean rank at step {chosen.get('step')} {s.final_mean_rank:.2f} "
                     f"(budget {s.final_budget} over {s.n_matrices} matrices, "
                     f"{s.final_adapter_params:,} adapter parameters kept)")
    elif s.final_mean_rank is not None:
        parts.append(f"final mean rank {s.final_mean_rank:.2f} (b(T) {s.final_budget} over "
                     f"{s.n_matrices} matrices, {s.final_adapter_params:,} adapter "
                     "parameters kept)")
    return "; ".join(parts)
