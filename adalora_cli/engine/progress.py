"""Rich progress bar for training: step, loss, learning rate and AdaLoRA's budget."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class TrainProgress:
    """A context manager around one rich Progress task; silent when disabled."""

    def __init__(self, total: int, disable: bool = False, start: int = 0):
        self.total, self.start = total, start
        self._progress = Progress(
            TextColumn("[bold]train[/]"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=Console(file=sys.stderr),
            disable=disable,
            transient=False,
        )
        self._task = None
        self._last = ""

    def __enter__(self) -> TrainProgress:
        self._progress.start()
        self._task = self._progress.add_task("train", total=self.total, status="",
                                             completed=self.start)
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def advance(self, row: dict[str, Any]) -> None:
        parts = [f"loss {row['loss']:.4f}", f"lr {row['lr']:.2e}"]
        if "budget" in row:
            parts.append(f"budget {row['budget']}")
        self._last = "  ".join(parts)
        self._progress.update(self._task, advance=1, status=self._last)

    def note(self, text: str) -> None:
        """A transient message (e.g. 'evaluating validation') in place of the stats."""
        self._progress.update(self._task, status=text or self._last)
