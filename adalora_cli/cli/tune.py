"""``adalora tune``: a per-method search (learning rate and any other keys a manifest lists),
then the chosen values on the manifest's seeds."""

from __future__ import annotations

from pathlib import Path

import typer

from .boundary import boundary, err, out, quiet_libraries


def tune(
    manifest: Path = typer.Argument(
        ..., help="A tune manifest (experiments/tune_rotten_tomatoes.yaml)"),
    overrides: list[str] | None = typer.Argument(
        None, metavar="KEY=VALUE", help="Config overrides applied to every run"),
    jobs: int = typer.Option(1, "--jobs", "-j", help="Cells searched at once (one trial "
                                                     "each; a cell's trials run in order)"),
    sweep_dir: Path | None = typer.Option(
        None, "--sweep-dir", help="Where the studies and runs go (default: runs/<name>)"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No live view."),
    launcher: str = typer.Option(
        "local", "--launcher", help="local (processes on this machine) or slurm (each "
                                    "round of trials one submitit job array)"),
    slurm: list[str] | None = typer.Option(
        None, "--slurm", metavar="KEY=VALUE,...",
        help="SLURM job options as for adalora sweep, e.g. partition=gpu,time=4:00:00"),
    status: bool = typer.Option(
        False, "--status", help="Print every study's trials, pruned trials and best so far, "
                                "and the seed runs' states; train nothing."),
) -> None:
    """Tune each method of a manifest (a study per config, method and budget), then run
    the chosen values on the manifest's seeds.

    Trials are ordinary run directories in the sweep directory; a pruner may stop a trial
    at a periodic evaluation (it ends pruned). Killed anywhere, the same command continues
    where it stopped and makes the same choices.

    Examples:
      adalora tune experiments/tune_smoke.yaml
      adalora tune experiments/tune_rotten_tomatoes.yaml --jobs 2
      adalora tune experiments/tune_rotten_tomatoes.yaml --status
      adalora tune experiments/tune_table1_glue.yaml --launcher slurm

    Docs: docs/tuning.md"""
    from ..sweep.tune.command import TuneRequest, run_tune

    quiet_libraries()
    request = TuneRequest(manifest, list(overrides or []), jobs, sweep_dir, quiet, launcher,
                          slurm, status)
    with boundary(interrupted="interrupted; running trials were checkpointed and are resumed "
                              "when the tune is started again", os_errors=True):
        code = run_tune(request, out(), err())
    if code:
        raise typer.Exit(code)
