"""``adalora train``: one model, one method, one task -> one run directory."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from .boundary import boundary, note, out, quiet_libraries, rank0


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
    from ..engine.command import TrainRequest, run_train
    from ..rundir.owner import die_with_parent

    die_with_parent()  # started by a sweep: stop (with a checkpoint) if the sweep dies
    quiet_libraries()
    request = TrainRequest(config, list(overrides or []), run_dir, resume, dry_run, quiet,
                           nproc, argv=sys.argv[2:])
    with boundary(interrupted="interrupted; the run directory is marked failed"):
        outcome = run_train(request, note=note)
    if outcome.exit_code is not None:
        raise typer.Exit(outcome.exit_code)  # each rank said what there was to say
    if outcome.dry_run is not None:
        print_dry_run(outcome.dry_run)
    elif rank0():  # under torchrun, rank 0 speaks for the run
        print_result(outcome.run_dir)


def print_dry_run(result: dict) -> None:
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
    if "final_budget" in info:  # AdaLoRA trains at r0 but keeps only b(T): show both
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


def print_result(path: Path) -> None:
    summary = json.loads((path / "summary.json").read_text())
    console = out()
    # train.eval_at_start: the scores before training, beside the trained ones
    for split, metrics in (summary.get("metrics_at_start") or {}).items():
        shown = "  ".join(f"{k} {v:.4f}" for k, v in metrics.items())
        console.print(f"{split} before training: {shown}", soft_wrap=True)
    for split, metrics in summary["metrics"].items():
        shown = "  ".join(f"{k} {v:.4f}" for k, v in metrics.items())
        console.print(f"{split}: {shown}")
    console.print(f"run directory: {path}")
