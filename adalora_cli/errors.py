"""What every layer says about a failure: the exceptions that mean something to the CLI, the
first line of any error, the one ``warning:`` line, and the exit codes.

Kept at the bottom of the import order (it imports nothing of ours) so that a task, the
loop, a tracker, a sweep and the CLI all raise, describe and warn the same way, and the
CLI's error boundary can tell the exceptions apart without importing the layer that raised
them (importing the engine just to look would load torch into ``adalora report``). A file
that cannot be written (a full disk) is said the same way everywhere too, naming the file
(:func:`writing`).
"""

from __future__ import annotations

import errno
import os
import re
import resource
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

EXIT_FAILED = 1
"""A run or command broke for a reason that is not the user's input."""
EXIT_USAGE = 2
"""Bad input (config, arguments, paths): the message says what to fix."""
EXIT_BUSY = 73
"""EX_CANTCREAT: another live process owns the run directory."""
EXIT_PREEMPTED = 75
"""EX_TEMPFAIL: the run stopped on a signal with a checkpoint and can be resumed."""
EXIT_PRUNED = 76
"""A trial of ``adalora tune`` stopped by its study at an evaluation (its run directory
says ``pruned``): an end, not a failure, and nothing to resume."""
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


class Pruned(Exception):
    """A tune trial stopped by its study (a pruner's verdict on an evaluation, or a loss
    that diverged); exit 76. ``step`` is the optimizer step it stopped at."""

    def __init__(self, message: str, step: int):
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


SHOWN_CHARS = 120
"""The most characters of a user's value an error line quotes."""


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """``repr(value)`` as an error line quotes it: at most ``limit`` characters, and built
    without expanding the whole value (reprlib stops at a few items per level), so a value
    of a billion items, or one string of megabytes, is quoted in an instant as its start."""
    import reprlib

    short = reprlib.Repr()
    short.maxlevel, short.maxstring, short.maxother = 3, limit, limit
    short.maxlist = short.maxtuple = short.maxdict = short.maxset = 8
    text = short.repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def warning(text: str, stream=None) -> None:
    """The one ``warning:`` line every layer prints: on stderr (or ``stream``), yellow on a
    terminal, never wrapped (a log keeps each warning on one line)."""
    from rich.console import Console
    from rich.markup import escape

    console = Console(file=stream or sys.stderr)
    console.print(f"[yellow]warning:[/] {escape(text)}", highlight=False, soft_wrap=True)


class RankDied(RuntimeError):
    """Another process of this run died (killed, out of memory, crashed), so a collective
    call on this one failed: said as that, not as the backend's socket error."""


class WriteFailed(OSError):
    """A file could not be written; the message names it and says why, and ``errno`` is the
    operating system's reason (ENOSPC for a full disk), also where a library hid it."""


def write_errno(path: str | os.PathLike, err: BaseException, guess: bool = True) -> int | None:
    """The OS error number behind a failed write of ``path``. Libraries hide it: safetensors
    says "(os error 28)" in its message, torch's zip writer "unexpected pos"; with ``guess``
    a file stopped at the ``ulimit -f`` size is then EFBIG and a disk with under 1 MiB left
    ENOSPC."""
    code = getattr(err, "errno", None)
    if code is None:
        found = re.search(r"\(os error (\d+)\)", str(err))
        code = int(found.group(1)) if found else None
    if code is not None or not guess:
        return code
    path = Path(path)
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    try:
        if limit != resource.RLIM_INFINITY and path.exists() and path.stat().st_size >= limit:
            return errno.EFBIG
        free = os.statvfs(path.parent)
        if free.f_bavail * free.f_frsize < 1 << 20:
            return errno.ENOSPC
    except OSError:
        pass
    return None


def write_failed(path: str | os.PathLike, err: BaseException, *, then: str = "",
                 written_as: str | os.PathLike | None = None) -> WriteFailed:
    """``err``, raised while writing ``path`` (under the temporary name ``written_as``, if
    any), as one :class:`WriteFailed` line that names ``path`` and says why; ``then``: what
    to do once there is room (``"resume the run"``)."""
    code = write_errno(written_as or path, err)
    after = f", then {then}" if then else ""
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if code in (errno.ENOSPC, errno.EDQUOT):
        why = f"{os.strerror(code)} (free some space{after})"
    elif code == errno.EFBIG and limit != resource.RLIM_INFINITY:
        why = f"the file size limit (ulimit -f, {limit} bytes) was reached; raise it{after}"
    elif code is not None:
        why = os.strerror(code)
    else:
        why = describe(err)
    return WriteFailed(code or errno.EIO, f"could not write {path}: {why}")


@contextmanager
def writing(path: str | os.PathLike, *, then: str = "",
            written_as: str | os.PathLike | None = None,
            library: bool = False) -> Iterator[None]:
    """Inside, a failed write (an OSError, or an error naming one, as safetensors' does)
    leaves as a :class:`WriteFailed` naming ``path``; other errors pass unchanged.
    ``library``: the block is one library writer (torch.save, savefig), whose errors may
    hide the OS's entirely, so a full disk or file size limit is guessed
    (:func:`write_errno`)."""
    try:
        yield
    except WriteFailed:
        raise
    except Exception as err:
        if not isinstance(err, OSError) and write_errno(
                written_as or path, err, guess=library) is None:
            raise
        raise write_failed(path, err, then=then, written_as=written_as) from None
