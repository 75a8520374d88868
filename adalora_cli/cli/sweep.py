"""``adalora sweep``: a grid of configs x methods x budgets x seeds, one train per run."""

from __future__ import annotations

from pathlib import Path

import typer

from .boundary import boundary, err, out, quiet_libraries


def sweep(
    source: Path = typer.Argument(
        ..., help="A config (configs/glue/rte.yaml) or a manifest (experiments/table1_glue.yaml)"),
    overrides: list[str] | None = typer.Argument(
        None, metavar="KEY=VALUE", help="Config overrides applied to every run"),
    budget: str | None = typer.Option(
        None, "--budget", help="AdaLoRA final budgets b(T), e.g. 144,288,576; every other "
                               "method gets the matching size (docs/maths.md#budget-levels)"),
    methods: str | None = typer.Option(
        None, "--methods", help="Methods by name, e.g. adalora,lora,bitfit (default: the "
                                "config's method)"),
    seeds: str | None = typer.Option(None, "--seeds", help="e.g. 0,1,2 (default: the config's)"),
    jobs: int = typer.Option(1, "--jobs", "-j", help="Runs at once, packed onto the GPUs by the "
                                                     "peak memory their config took before"),
    sweep_dir: Path | None = typer.Option(
        None, "--sweep-dir", help="Where the run directories go (default: runs/<sweep name>)"),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="List the runs with their parameter counts; train nothing."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress display."),
    launcher: str = typer.Option(
        "local", "--launcher", help="local (processes on this machine) or slurm (one "
                                    "submitit job array, one run per task)"),
    slurm: list[str] | None = typer.Option(
        None, "--slurm", metavar="KEY=VALUE,...",
        help="SLURM job options, e.g. partition=gpu,time=24:00:00; also gpus_per_job, "
             "cpus, mem, account, qos, constraint, parallel, signal_delay, requeues, "
             "sbatch.<flag>=<value>"),
    status: bool = typer.Option(
        False, "--status", help="Print every run's state (run directories and the "
                                "scheduler); submit and train nothing."),
    wait: bool = typer.Option(
        False, "--wait", help="With --launcher slurm: block until the submitted jobs end."),
    resubmit: bool = typer.Option(
        False, "--resubmit", help="With --launcher slurm: also submit runs whose earlier job "
                                  "may still be queued (where sacct and squeue cannot tell)."),
) -> None:
    """Run a grid of configs x methods x budgets x seeds, one `adalora train` per run.

    Re-running the same sweep skips finished runs and resumes unfinished ones from their
    checkpoints; two sweeps on one sweep directory share the runs. On SLURM it submits
    only what is not finished, running or queued.

    Examples:
      adalora sweep experiments/demo_rotten_tomatoes.yaml --jobs 2
      adalora sweep configs/glue/rte.yaml --methods adalora,lora --budget 144,576
      adalora sweep experiments/smoke.yaml --dry-run
      adalora sweep experiments/table1_glue.yaml --launcher slurm
      adalora sweep experiments/table1_glue.yaml --status

    Docs: docs/sweeps.md"""
    from ..sweep.command import SweepRequest, run_sweep

    quiet_libraries()
    request = SweepRequest(source, list(overrides or []), budget, methods, seeds, jobs,
                           sweep_dir, dry_run, quiet, launcher, slurm, status, wait,
                           resubmit)
    with boundary(interrupted="interrupted; running runs were checkpointed and are resumed "
                              "when the sweep is started again", os_errors=True):
        code = run_sweep(request, out(), err())
    if code:
        raise typer.Exit(code)
