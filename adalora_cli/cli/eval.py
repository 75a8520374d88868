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
    harness: str | None = typer.Option(
        None, "--harness", metavar="TASKS",
        help="lm-evaluation-harness tasks, comma-separated (bbc_topic_chat, gsm8k, ...), "
             "scored on a decoder run's model in place of its own evaluation; results in "
             "harness.json"),
    limit: int | None = typer.Option(
        None, "--limit", min=1, help="With --harness: only the first LIMIT rows of each task"),
    base: bool = typer.Option(
        False, "--base", help="With --harness: score the base model too (before training)"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress lines."),
) -> None:
    """Score a finished run again, on its evaluation splits or on other data.

    Writes eval/NAME.json in the run directory; the training results stay as they were.
    The KEY=VALUE overrides it takes say where the data comes from and how it is read
    (task.*: task.data_files.validation, task.data_dir, task.max_length, ...) and how the
    run is scored (train.eval_batch_size, train.device, train.precision); keys that would
    change the trained model or pick training rows (task.name, task.max_train_samples)
    are refused.

    With --harness TASKS it scores a decoder run (causal_lm, bbc_topic_chat) with
    lm-evaluation-harness instead (the harness extra): lm-eval's tasks or the ones adalora
    ships, on the run's adapted model in memory (and with --base on the base model), the
    scores written to harness.json, where `adalora report` reads them.

    Examples:
      adalora eval runs/rte-adalora-s0-...
      adalora eval runs/rte-adalora-s0-... task.data_files.validation=dev2.tsv
      adalora eval runs/rte-adalora-s0-... --name dev2 task.data_dir=data/rte-dev2
      adalora eval runs/llm-adalora-s0-... --harness bbc_topic_chat --base

    Docs: docs/using-a-run.md"""
    from ..artifacts.rescore import rescore
    from ..config import ConfigError
    from ..tasks.columns import metrics_line

    quiet_libraries()
    if harness is not None:
        _harness(run_dir, harness, overrides or [], name, limit, base, quiet)
        return
    with boundary():
        if limit is not None or base:
            raise ConfigError("--limit and --base go with --harness TASKS; drop them, or "
                              "name the harness tasks")
        path = rescore(run_dir, overrides or [], name, quiet=quiet)
    result = json.loads(path.read_text())
    console = out()
    for split, metrics in result["metrics"].items():
        console.print(f"{split}: {metrics_line(metrics)}", highlight=False)
    console.print(f"wrote {path}", highlight=False, soft_wrap=True)


def _harness(run_dir: Path, tasks: str, overrides: list[str], name: str | None,
             limit: int | None, base: bool, quiet: bool) -> None:
    """``--harness``: lm-evaluation-harness scores into harness.json."""
    from ..artifacts.harness import lines, score_run
    from ..config import ConfigError
    from ..rundir.layout import HARNESS

    with boundary():
        if overrides or name:
            raise ConfigError("--harness scores the harness tasks' own rows: drop "
                              f"{(overrides or ['--name'])[0]!r} (KEY=VALUE and --name are "
                              "for the run's own evaluation)")
        names = [t.strip() for t in tasks.split(",") if t.strip()]
        scored = score_run(run_dir, names, limit=limit, base=base, quiet=quiet)
    console = out()
    for line in lines(run_dir, scored):
        console.print(line, highlight=False, soft_wrap=True)
    console.print(f"wrote {run_dir / HARNESS}", highlight=False, soft_wrap=True)
