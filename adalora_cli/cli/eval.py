"""``adalora eval``: score a finished run again, on its own splits or on other data."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from .boundary import boundary, out, quiet_libraries


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
    from ..tasks.columns import metrics_line

    quiet_libraries()
    with boundary():
        path = rescore(run_dir, overrides or [], name, quiet=quiet)
    result = json.loads(path.read_text())
    console = out()
    for split, metrics in result["metrics"].items():
        console.print(f"{split}: {metrics_line(metrics)}", highlight=False)
    console.print(f"wrote {path}", highlight=False, soft_wrap=True)
