"""``adalora report``: the paper's tables and figures from finished run directories."""

from __future__ import annotations

from pathlib import Path

import typer

from .boundary import boundary, err, out


def report(
    paths: list[Path] = typer.Argument(..., metavar="PATH",
                                       help="Run directories, or folders holding them at any "
                                            "depth (e.g. runs/)"),
    fmt: str = typer.Option("rich", "--format", "-f",
                            help="rich, markdown, csv, latex, or several: markdown,csv; all"),
    out_dir: Path | None = typer.Option(
        None, "--out", metavar="DIR",
        help="Write the report files and figures (PNG) into this folder"),
    paper: bool = typer.Option(False, "--paper", help="Show the paper's numbers beside ours, "
                                                      "with the difference"),
    figures: bool = typer.Option(True, "--figures/--no-figures", help="Figures (with --out)"),
    eval_name: str | None = typer.Option(
        None, "--eval", metavar="NAME", help="Show the scores of `adalora eval ... --name NAME` "
                             "(eval/NAME.json) instead of the training's"),
    min_seeds: int = typer.Option(
        1, "--min-seeds", help="Leave out settings with fewer seeds (e.g. 2 after a "
                               "learning-rate search on seed 0)"),
    against: str | None = typer.Option(
        None, "--against", metavar="METHOD",
        help="Compare every method with this one at the same budget level (Welch t-test); "
             "default lora, e.g. adalora"),
    per_seed: bool = typer.Option(False, "--per-seed",
                                  help="Show every seed's value beside the means"),
) -> None:
    """Tables (paper Tables 1-3, 9) and figures (3-5) from finished run directories.

    Each PATH is a run directory or a folder holding runs at any depth.

    Examples:
      adalora report runs/demo_rotten_tomatoes --format markdown
      adalora report runs/ --paper --out report/
      adalora report runs/ --eval dev2 --min-seeds 2

    Docs: docs/sweeps.md#reports"""
    from ..report.command import run_report

    with boundary(interrupted="interrupted", os_errors=True):
        run_report(list(paths), fmt, out_dir, paper=paper, figures=figures,
                   eval_name=eval_name, min_seeds=min_seeds, against=against,
                   per_seed=per_seed, out=out(),
                   err=err())
