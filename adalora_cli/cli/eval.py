"""``adalora eval``: score a finished run again, on its own splits or on other data."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from .boundary import boundary, out, quiet_libraries


def eval_run(
    run_dir: Path = typer.Argument(..., help="A finished run directory"),
    overrides: list[str] | None = typer.Argument(
        None, metavar="KEY=VALUE",
        help="task.*, train.eval_batch_size, train.device or train.precision, e.g. "
             "task.data_files.validation=my_dev.tsv"),
    name: str | None = typer.Option(
        None, "--name", help="Result name: eval/NAME.json (default: the data file's stem, "
                             "or 'default' for the task's own evaluation splits)"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress lines."),
) -> None:
    """Score a finished run again, on its evaluation splits or on other data.

    Writes eval/NAME.json in the run directory; the training results stay as they were.
    The KEY=VALUE overrides it takes say where the data comes from and how it is read
    (task.*: task.data_files.validation, task.data_dir, task.max_length, ...) and how the
    run is scored (train.eval_batch_size, train.device, train.precision); keys that would
    change the trained model or pick training rows (task.name, task.max_train_samples)
    are refused.

    Examples:
      adalora eval runs/rte-adalora-s0-...
      adalora eval runs/rte-adalora-s0-... task.data_files.validation=dev2.tsv
      adalora eval runs/rte-adalora-s0-... --name dev2 task.data_dir=data/rte-dev2

    Docs: docs/using-a-run.md"""
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
