"""What every command shares: its consoles, the quieted libraries, and the one error boundary
that turns an exception into one ``error:`` line and the documented exit code.

    2    bad input (ConfigError): the message says what to fix
    1    a command or run that broke; a run's directory is marked failed
    73   another live process owns the run directory
    75   a run stopped by SIGTERM/SIGUSR1 with a checkpoint: resume it
    76   a trial of adalora tune stopped by its study (marked pruned; nothing to resume)
    130  Ctrl-C;  143  a sweep stopped by SIGTERM

``ADALORA_DEBUG=1`` re-raises the unexpected ones (1 and 2) with their traceback.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import typer
from rich.console import Console
from rich.markup import escape

from ..config import ConfigError
from ..errors import (
    EXIT_BUSY,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_PREEMPTED,
    EXIT_PRUNED,
    EXIT_TERMINATED,
    EXIT_USAGE,
    Preempted,
    Pruned,
    RankDied,
    RunBusy,
    SweepStopped,
    WriteFailed,
    describe,
)

OFF_TERMINAL_WIDTH = 10_000
"""The width of our output into a pipe or a file: wider than any table we print."""


def out() -> Console:  # made per call so redirected or captured streams are honoured
    return _console(stderr=False)


def err() -> Console:
    return _console(stderr=True)


def _console(stderr: bool) -> Console:
    # soft_wrap: a line longer than the width is never broken, so a log never splits
    # "accuracy 0.4375" across two lines. A table has no soft wrap: off a terminal rich
    # would lay it out in 80 columns (or $COLUMNS), folding run names and squeezing columns
    # in a file that no terminal width limits; there it gets all the width it needs.
    console = Console(stderr=stderr, soft_wrap=True)
    if not console.is_terminal:
        console.width = OFF_TERMINAL_WIDTH
    return console


def rank0() -> bool:
    """Under torchrun every rank runs the command; rank 0 speaks for the run."""
    return os.environ.get("RANK", "0") == "0"


def quiet_libraries() -> None:
    """Our progress bar and one-line errors only: silence the libraries' load reports,
    per-map progress bars and advisory warnings (real errors still raise)."""
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    import logging

    # transformers imports torchao (the qlora extra) with its models whenever it is
    # installed: torchao then reports each optional CUDA kernel it cannot load, and torch a
    # deprecation in how torchao registers its enums; neither concerns a run
    for name in ("torchao", "torch.utils._pytree"):
        logging.getLogger(name).setLevel(logging.ERROR)
    import datasets
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    datasets.utils.logging.set_verbosity_error()
    datasets.disable_progress_bars()


def note(text: str) -> None:
    if rank0():
        err().print(f"[yellow]note:[/] {text}", highlight=False, soft_wrap=True)


LONGEST = 2000
"""The most characters of an error line: the messages quote values cut short
(errors.shown), and this catches one quoted whole, say a string of megabytes in a config."""


def fail(message: str, code: int) -> None:
    if len(message) > LONGEST:
        message = f"{message[:LONGEST]}... ({len(message) - LONGEST:,} more characters)"
    # escape: a message may quote config text such as log.to=[wandb], not Rich markup
    if rank0():  # under torchrun one line, not one per rank
        err().print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _debug() -> bool:
    return os.environ.get("ADALORA_DEBUG", "") not in ("", "0")


def os_error(error: OSError) -> str:
    """One line for a file-system error: what failed, on which path."""
    where = f" ({error.filename})" if error.filename else ""
    return f"{error.strerror or type(error).__name__}{where}; check the path and free disk space"


def explain(error: BaseException, interrupted: str, os_errors: bool) -> tuple[str, int]:
    """The one line and the exit code for ``error`` (see the module docstring)."""
    where = getattr(error, "run_dir", None)  # set by the loop on the directory it marked
    if isinstance(error, KeyboardInterrupt):
        return (interrupted_run(where) if where else interrupted), EXIT_INTERRUPTED
    if isinstance(error, ConfigError):
        return str(error), EXIT_USAGE
    if isinstance(error, RunBusy):
        return f"{error}; wait for it, or stop that process first", EXIT_BUSY
    if isinstance(error, Preempted):
        return (f"{error}" if where else f"{error} before the run started; nothing was "
                "written"), EXIT_PREEMPTED
    if isinstance(error, Pruned):
        return f"{error} (run directory marked pruned: {where})", EXIT_PRUNED
    if isinstance(error, SweepStopped):
        return ("stopped by SIGTERM; running runs were checkpointed and are resumed when "
                "the sweep is started again"), EXIT_TERMINATED
    if isinstance(error, WriteFailed):  # a full disk: the line names the file and the fix
        return f"{error.strerror}{suffix_of(where)}", EXIT_FAILED
    if isinstance(error, RankDied):  # says what to do
        return f"{error}{suffix_of(where)}", EXIT_FAILED
    if os_errors and isinstance(error, OSError):
        return os_error(error), EXIT_FAILED
    return (f"{describe(error)}{suffix_of(where)}; rerun with ADALORA_DEBUG=1 for the "
            "traceback", EXIT_FAILED)


def suffix_of(where) -> str:
    return f" (run directory marked failed: {where})" if where else ""


def interrupted_run(where) -> str:
    """What a second Ctrl-C left behind, truthfully: a resume continues from the latest
    checkpoint, or starts over from step 0 when there is none."""
    from ..engine.checkpoint import latest_checkpoint
    from ..rundir.run import resume_hint

    latest, resume = latest_checkpoint(where), resume_hint(where)
    if latest is None:
        return (f"interrupted; {where} is marked failed and has no checkpoint yet (a "
                f"resume, {resume}, starts it over from step 0)")
    return (f"interrupted; {where} is marked failed; {resume} "
            f"continues from its last checkpoint (step {int(latest.name[5:])})")


@contextmanager
def boundary(interrupted: str = "interrupted; nothing was left half-written",
             os_errors: bool = False) -> Iterator[None]:
    """Run a command's work: any exception leaves as one ``error:`` line and its exit code.

    ``interrupted``: what Ctrl-C left behind, in this command's words. ``os_errors``: say
    a file-system error as "what failed (path)", for commands that only read and write
    files the user named (sweep, report)."""
    try:
        yield
    except typer.Exit:
        raise  # a command's own exit code (it has said what there was to say)
    except (Exception, KeyboardInterrupt) as error:
        message, code = explain(error, interrupted, os_errors)
        if code in (EXIT_USAGE, EXIT_FAILED) and _debug():
            raise
        fail(message, code)
