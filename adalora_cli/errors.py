"""What every layer says about a failure: its first line, and the CLI's exit codes.

Kept at the bottom of the import order (it imports nothing of ours) so that a task, the
loop, a tracker and the CLI all describe an exception the same way.
"""

from __future__ import annotations

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


def first_line(err: BaseException) -> str:
    """The first line of ``err``'s message, or its type's name when it has none: library
    messages can span pages, and the CLI's promise is one line per error."""
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__


def describe(err: BaseException) -> str:
    """``Type: first line`` (just ``Type`` for an empty message)."""
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__
