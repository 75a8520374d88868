"""Training progress: a rich bar on a terminal, plain lines in a log.

On a terminal the bar shows step, loss, learning rate and AdaLoRA's budget. When stdout is
not a terminal (``make demo > log``, a sweep's or SLURM job's log file) a live bar shows
nothing until the run ends, so one plain line is printed every so often instead, as
Hugging Face's Trainer logs::

    step 40/320 (12%)  loss 0.6931  lr 1.00e-03  budget 72  elapsed 0:01:02  eta 0:07:13

``ADALORA_PROGRESS_EVERY`` sets how often: ``30s`` (the default: at most one line per 30
seconds), ``100`` (every 100 steps) or ``0`` (no lines). The final step always gets its
line. The bar draws only where stderr is a terminal, so a log never holds its frames.

Between logged rows the bar and the lines show the last logged row's loss with its step,
``loss 0.6931 (step 40)``, while the step count and the clock move on.

Every evaluation before the end prints its scores (above the bar on a terminal, as a line
in a log), ``step 16/32  validation: accuracy 0.4375``; the final scores are the command's
own last lines. Slow work between steps (loading the model, an evaluation) says how far
along it is (:class:`PhaseLines`): in the bar on a terminal, else as a line at most every
``ADALORA_PROGRESS_EVERY`` seconds (30 when it counts steps), and never less often than
that while the work goes on, however long one batch or one file read takes::

    step 0/100  evaluating validation: generating 64/205  elapsed 0:00:31  eta 0:01:08
"""

from __future__ import annotations

import os
import sys
import threading
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


def phase_seconds() -> float:
    """How often :class:`PhaseLines` prints: ``ADALORA_PROGRESS_EVERY`` seconds, 30 when it
    counts steps (a phase has none), 0 (never) when it is 0."""
    steps, seconds = parse_every(os.environ.get(ENV, DEFAULT_EVERY))
    return seconds if seconds else float(DEFAULT_EVERY[:-1]) if steps else 0.0


class PhaseLines:
    """Lines for slow work outside the training steps: loading the model, an evaluation.

    :meth:`begin` names the phase (and prints it); the task's loops report how far along
    they are (:meth:`report`, a listener of ``adalora_cli.tasks.progress``), printed at most
    once per ``seconds``. Inside :meth:`watching` a thread also prints the phase's state when
    ``seconds`` passed without a line, so that a read or a batch that reports nothing for
    minutes (a GGUF file's metadata, a long generation batch) still shows the run is alive.
    ``seconds`` 0: no such lines."""

    def __init__(self, seconds: float, out=None, clock: Callable[[], float] = time.monotonic):
        self.seconds, self.out, self.clock = seconds, out or sys.stdout, clock
        self.name = ""
        self.part: tuple[str, int, int] | None = None
        self.began = self.part_began = self.last = clock()
        self._lock = threading.Lock()

    def begin(self, name: str, show: bool = True) -> None:
        """A new phase ``name``, printed (even with the interval lines off) unless ``show``
        is False (``--quiet``, or said elsewhere)."""
        with self._lock:
            self.name, self.part = name, None
            self.began = self.part_began = self.last = self.clock()
            if show:
                print(name, file=self.out, flush=True)

    def end(self) -> None:
        with self._lock:
            self.name, self.part = "", None

    def report(self, what: str, done: int, total: int) -> None:
        """``done`` of ``total`` of the phase's part ``what`` (e.g. generating 64 of 205)."""
        with self._lock:
            now = self.clock()
            if self.part is None or self.part[0] != what:
                self.part_began = now
            self.part = (what, done, total)
            if self.seconds and self.name and now - self.last >= self.seconds:
                self._print(now)

    def tick(self) -> None:
        """The watcher's check: a line when ``seconds`` passed without one."""
        with self._lock:
            now = self.clock()
            if self.seconds and self.name and now - self.last >= self.seconds:
                self._print(now)

    def _print(self, now: float) -> None:
        self.last = now
        if self.part is None:
            line = f"{self.name}  elapsed {clock_text(now - self.began)}"
        else:
            what, done, total = self.part
            spent = now - self.part_began
            eta = clock_text(spent / done * (total - done)) if done else "?"
            line = (f"{self.name}: {what} {done}/{total}  elapsed {clock_text(spent)}  "
                    f"eta {eta}")
        print(line, file=self.out, flush=True)

    def watching(self):
        """Inside: the watcher thread runs (nothing starts when the lines are off)."""
        return _Watcher(self) if self.seconds else _Nothing()


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class _Watcher:
    """Calls ``lines.tick()`` every second from a daemon thread until the block ends."""

    def __init__(self, lines: PhaseLines):
        self.lines, self.stop = lines, threading.Event()
        self.thread = threading.Thread(target=self._run, name="adalora-progress", daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(1.0):
            self.lines.tick()

    def __enter__(self) -> _Watcher:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def stats(row: dict[str, Any], step: int | None = None) -> str:
    """A logged row's loss, rate and budget; ``(step N)`` after the loss when the row is not
    step ``step``'s own (between logged rows), so a repeated loss does not look live."""
    loss = "loss -" if row["loss"] is None else f"loss {row['loss']:.4f}"  # a skipped step
    if step is not None and row.get("step", step) != step:
        loss += f" (step {row['step']})"
    parts = [loss, f"lr {row['lr']:.2e}"]
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
        self._row: dict[str, Any] | None = None
        self._step = start  # (the plain lines count steps only when they print)
        self._noted = ""
        # an evaluation's progress: in the bar's status on a terminal, as lines in a log
        self._phase = PhaseLines(phase_seconds() if self._lines.enabled else 0.0, sys.stdout,
                                 clock)
        self._watcher = self._phase.watching()

    def __enter__(self) -> TrainProgress:
        self._progress.start()
        self._task = self._progress.add_task("train", total=self.total, status="",
                                             completed=self.start)
        self._watcher.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._watcher.__exit__(*exc)
        self._progress.stop()

    def _stats(self, step: int) -> str:
        return stats(self._row, step) if self._row is not None else ""

    def advance(self, step: int, row: dict[str, Any] | None = None) -> None:
        """One step done; ``row``: its training row when it logged one (the bar shows the
        last row's loss and rate, with its step when it is an earlier one: reading every
        step's loss would wait on the GPU)."""
        self._step = step
        if row is not None:
            self._row = row
        self._progress.update(self._task, advance=1, status=self._stats(step))
        if self._lines.enabled:
            self._lines.advance(step, self._stats(step))

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
        self._progress.reset(self._task, completed=self.start, status=self._stats(self._step))

    def note(self, text: str) -> None:
        """A transient message (e.g. 'evaluating validation') in place of the stats; ''
        ends it."""
        self._noted = text
        self._progress.update(self._task, status=text or self._stats(self._step))
        self._lines.note(text)
        if text:  # the line above said it; reports add how far along it is
            self._phase.begin(f"step {self._step}/{self.total}  {text}", show=False)
        else:
            self._phase.end()

    def report(self, what: str, done: int, total: int) -> None:
        """How far along the noted work is (a listener of ``adalora_cli.tasks.progress``)."""
        if self.disable or not self._noted:
            return
        self._progress.update(self._task, status=f"{self._noted}: {what} {done}/{total}")
        self._phase.report(what, done, total)
