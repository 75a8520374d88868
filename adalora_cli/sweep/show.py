"""What ``adalora sweep --status`` and a SLURM submission print: a table and a count line."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table

from .runs import Outcome
from .status import RunStatus

ORDER = ("submitted", "queued", "running", "finished", "pruned", "preempted", "unfinished",
         "failed",
         "cancelled", "unknown", "not started", "busy", "skipped")
COLOURS = {"finished": "green", "failed": "red", "queued": "cyan", "submitted": "cyan",
           "running": "yellow", "preempted": "yellow", "pruned": "yellow", "unknown": "magenta",
           "cancelled": "red"}


def count_line(states: list[str]) -> str:
    counts = Counter(states)
    parts = [f"{counts[s]} {s}" for s in ORDER if counts[s]]
    return f"{len(states)} runs: " + (", ".join(parts) if parts else "none")


def print_status(rows: list[RunStatus], where: Path, console: Console) -> None:
    """Every run's state; nothing is submitted or started."""
    table = Table(title=f"sweep status ({where})")
    for name in ("run", "state", "job", "detail"):
        table.add_column(name, overflow="fold")
    for r in rows:
        colour = COLOURS.get(r.state)
        state = f"[{colour}]{r.state}[/]" if colour else r.state
        table.add_row(r.run, state, r.job, r.detail)
    console.print(table)
    console.print(count_line([r.state for r in rows]), highlight=False, soft_wrap=True)
    sources = list(dict.fromkeys(r.source for r in rows if r.source))
    if sources:
        console.print(f"job states from: {'; '.join(sources)}", highlight=False,
                      soft_wrap=True)
    unknown = sum(r.state == "unknown" for r in rows)
    if unknown:
        console.print(f"{unknown} run(s) have a submitted job that may still be queued, and "
                      "neither sacct nor squeue answered here: they are not submitted again; "
                      "check with your cluster's tools, then add --resubmit to submit them "
                      "anyway", highlight=False, soft_wrap=True)


def print_submitted(outcomes: list[Outcome], where: Path, console: Console) -> None:
    """After a SLURM launch: what was submitted now, and where everything else stands."""
    rows = [RunStatus(o.run.name, o.status, o.error, o.job, o.source) for o in outcomes]
    print_status(rows, where, console)
    console.print(f"runs' output: {where}/logs/<run>.log; jobs' output: {where}/slurm/; "
                  f"follow with: adalora sweep ... --status", highlight=False, soft_wrap=True)
