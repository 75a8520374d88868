"""What every layer says about a failure: the exceptions that mean something to the CLI, the
first line of any error, the one ``warning:`` line, and the exit codes.

Kept at the bottom of the import order (it imports nothing of ours) so that a task, the
loop, a tracker, a sweep and the CLI all raise, describe and warn the same way, and the
CLI's error boundary can tell the exceptions apart without importing the layer that raised
them (importing the engine just to look would load torch into ``adalora report``).
"""

from __future__ import annotations

import sys

EXIT_FAILED = 1
"""A run or command broke for a reason that is not the user's input."""
EXIT_USAGE = 2
"""Bad input (config, arguments, paths): the message says what to fix."""
EXIT_BUSY = 73
"""EX_CANTCREAT: another live process owns the run directory."""
EXIT_PREEMPTED = 75
"""EX_TEMPFAIL: the run stopped on a signal with a checkpoint and can be resumed."""
EXIT_INTERRUPTED = 130
"""128 + SIGINT, as a shell reports Ctrl-C."""
EXIT_TERMINATED = 143
"""128 + SIGTERM: a sweep stopped by SIGTERM (its runs were checkpointed)."""


class RunBusy(Exception):
    """Another live process owns the run directory (exit 73)."""


class Preempted(Exception):
    """The process was asked to stop (SIGTERM, SIGUSR1 or Ctrl-C); exit 75. ``step`` is the
    optimizer step it stopped at, once the run owns its directory."""

    def __init__(self, message: str = "", step: int | None = None):
        super().__init__(message)
        self.step = step


class SweepStopped(Exception):
    """The sweep got SIGTERM; its training processes were stopped with checkpoints (143)."""


def first_line(err: BaseException) -> str:
    """The first line of ``err``'s message, or its type's name when it has none: library
    messages can span pages, and the CLI's promise is one line per error."""
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__


def describe(err: BaseException) -> str:
    """``Type: first line`` (just ``Type`` for an empty message)."""
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__


def warning(text: str, stream=None) -> None:
    """The one ``warning:`` line every layer prints: on stderr (or ``stream``), yellow on a
    terminal, never wrapped (a log keeps each warning on one line)."""
    from rich.console import Console
    from rich.markup import escape

    console = Console(file=stream or sys.stderr)
    console.print(f"[yellow]warning:[/] {escape(text)}", highlight=False, soft_wrap=True)
