"""Training progress: a rich bar on a terminal, plain lines in a log.

On a terminal the bar shows step, loss, learning rate and AdaLoRA's budget. When stdout is
not a terminal (``make demo > log``, a sweep's or SLURM job's log file) a live bar shows
nothing until the run ends, so one plain line is printed every so often instead, as
Hugging Face's Trainer logs::

    step 40/320 (12%)  loss 0.6931  lr 1.00e-03  budget 72  elapsed 0:01:02  eta 0:07:13

``ADALORA_PROGRESS_EVERY`` sets how often: ``30s`` (the default: at most one line per 30
seconds), ``100`` (every 100 steps) or ``0`` (no lines). The final step always gets its
line. The bar draws only where stderr is a terminal, so a log never holds its frames.

Every evaluation before the end prints its scores (above the bar on a terminal, as a line
in a log), ``step 16/32  validation: accuracy 0.4375``; the final scores are the command's
own last lines.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
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

from ..config import ConfigError

ENV = "ADALORA_PROGRESS_EVERY"
DEFAULT_EVERY = "30s"


def parse_every(text: str) -> tuple[int, float]:
    """``"30s"`` -> (0, 30.0): by seconds; ``"100"`` -> (100, 0.0): by steps; ``"0"``: off."""
    text = text.strip().lower()
    try:
        if text.endswith("s"):
            seconds = float(text[:-1])
            if seconds >= 0:
                return 0, seconds
        else:
            steps = int(text)
            if steps >= 0:
                return steps, 0.0
    except ValueError:
        pass
    raise ConfigError(f"{ENV}={text!r} is not an interval; use e.g. 30s (seconds), 100 "
                      "(steps) or 0 (no progress lines)")


def check_env() -> None:
    """A bad ``ADALORA_PROGRESS_EVERY`` is refused before a run directory is written."""
    parse_every(os.environ.get(ENV, DEFAULT_EVERY))


def clock_text(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class PlainLines:
    """One line per interval, for logs; ``every`` as :func:`parse_every` returns it."""

    def __init__(self, total: int, start: int, every: tuple[int, float], out,
                 clock: Callable[[], float] = time.monotonic):
        self.total, self.start, self.out, self.clock = total, start, out, clock
        self.steps, self.seconds = every
        self.began = self.last_time = clock()
        self.step = start

    @property
    def enabled(self) -> bool:
        return bool(self.steps or self.seconds)

    def advance(self, step: int, text: str) -> None:
        """After step ``step``; ``text``: the stats of the last logged row."""
        self.step = step
        now = self.clock()
        if self.steps:
            due = self.step % self.steps == 0
        else:
            due = self.seconds > 0 and now - self.last_time >= self.seconds
        if due or self.step >= self.total:
            self.last_time = now
            self._print(text, now)

    def note(self, text: str) -> None:
        """An evaluation can take minutes: say it started."""
        if text and self.enabled:
            self._print(text, self.clock())

    def _print(self, text: str, now: float) -> None:
        elapsed, done = now - self.began, self.step - self.start
        eta = elapsed / done * (self.total - self.step) if done > 0 else None
        pct = 100 * self.step // max(1, self.total)
        line = (f"step {self.step}/{self.total} ({pct}%)  {text}  elapsed "
                f"{clock_text(elapsed)}  eta {clock_text(eta) if eta is not None else '?'}")
        print(line, file=self.out, flush=True)


def stats(row: dict[str, Any]) -> str:
    parts = [f"loss {row['loss']:.4f}", f"lr {row['lr']:.2e}"]
    if "budget" in row:
        parts.append(f"budget {row['budget']}")
    return "  ".join(parts)


def _is_tty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stream
        return False


class TrainProgress:
    """A context manager around the bar (on a terminal) or plain lines (stdout not a
    terminal); silent when disabled (``--quiet``, ranks other than 0)."""

    def __init__(self, total: int, disable: bool = False, start: int = 0,
                 clock: Callable[[], float] = time.monotonic):
        self.total, self.start, self.disable = total, start, disable
        every = (0, 0.0)
        if not disable and not _is_tty(sys.stdout):
            every = parse_every(os.environ.get(ENV, DEFAULT_EVERY))
        self._lines = PlainLines(total, start, every, sys.stdout, clock)
        console = Console(file=sys.stderr)
        self._progress = Progress(
            TextColumn("[bold]train[/]"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=console,
            # off a terminal a live bar only prints its last frame at the end
            disable=disable or not console.is_terminal,
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

    def advance(self, step: int, row: dict[str, Any] | None = None) -> None:
        """One step done; ``row``: its training row when it logged one (the bar shows the
        last row's loss and rate: reading every step's loss would wait on the GPU)."""
        if row is not None:
            self._last = stats(row)
        self._progress.update(self._task, advance=1, status=self._last)
        if self._lines.enabled:
            self._lines.advance(step, self._last)

    def scores(self, step: int, split: str, metrics: dict[str, float]) -> None:
        """An evaluation's scores, as a line that stays (not for the final evaluation, whose
        scores the command prints when the run ends)."""
        if self.disable or step >= self.total:
            return
        from ..tasks.columns import metrics_line

        line = f"step {step}/{self.total}  {split}: {metrics_line(metrics)}"
        if self._progress.live.is_started:  # above the bar, which redraws below it
            self._progress.console.print(line, highlight=False, soft_wrap=True)
        else:
            print(line, file=sys.stdout, flush=True)

    def restart_clock(self) -> None:
        """Time from now: elapsed and eta then count training steps only, not an evaluation
        before the first step (train.eval_at_start)."""
        self._lines.began = self._lines.last_time = self._lines.clock()
        self._progress.reset(self._task, completed=self.start, status=self._last)

    def note(self, text: str) -> None:
        """A transient message (e.g. 'evaluating validation') in place of the stats."""
        self._progress.update(self._task, status=text or self._last)
        self._lines.note(text)
