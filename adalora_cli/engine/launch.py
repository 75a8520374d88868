"""``adalora train ... --nproc N``: the same command on N local processes, via torchrun's
own launcher (``torch.distributed.launcher``), so the user needs no second tool.

torchrun itself reports a failed worker with a multi-line traceback; here the launch
returns the failing rank's exit code (2 for bad input, 75 for a preempted run, ...) and
each rank's one-line error is all the user sees.

The ranks share the machine's cores: unless the user set ``OMP_NUM_THREADS``, each gets
cores / N threads (as ``sweep --jobs`` gives each run), not the default of every core per
rank, which on a CPU oversubscribes the cores N times over.

The ranks run the very ``adalora_cli`` this process runs. ``python -m adalora_cli`` would
look in the current directory first, so from a folder holding another ``adalora_cli`` (a
second checkout, an older copy) the ranks would run that one; they start through
:data:`RANK_MAIN` instead, which takes the current directory off ``sys.path`` (as ``-P``
does on Python 3.11+) and, if the package is then found anywhere but where this process
found it, puts its folder first.

The ranks must not outlive the launcher: each asks Linux for SIGTERM when it dies (even by
SIGKILL), as a sweep's training processes do, and so checkpoints and stops as preempted
instead of finishing the run unwatched (see ``rundir.owner.die_with_parent``).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from ..errors import EXIT_FAILED, EXIT_PREEMPTED
from ..rundir.owner import PARENT_ENV
from ..threads import child_defaults

RANK_MAIN = "; ".join([  # one line, so the "$ ..." line a sweep logs stays one line
    "import importlib.util, os, runpy, sys",
    "origin = sys.argv.pop(1)",
    "sys.path[:1] = [] if sys.path[:1] == [''] else sys.path[:1]",
    "spec = importlib.util.find_spec('adalora_cli')",
    "spec is not None and spec.origin == origin"
    " or sys.path.insert(0, os.path.dirname(os.path.dirname(origin)))",
    "runpy.run_module('adalora_cli', run_name='__main__', alter_sys=True)"])
"""Each rank's program (``python -c RANK_MAIN ORIGIN ARGS``): ``adalora_cli`` from the file
``ORIGIN`` (the launcher's ``adalora_cli/__init__.py``), never from the current directory
(``-c`` puts it first on ``sys.path``), then ``python -m adalora_cli ARGS``."""


def _quiet_agent() -> None:
    """The elastic agent logs each worker's exit at WARNING/ERROR; the ranks already said
    what failed, in one line."""
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if name.startswith("torch.distributed.elastic") and isinstance(logger, logging.Logger):
            logger.setLevel(logging.CRITICAL)


@contextmanager
def rank_threads(nproc: int) -> Iterator[dict[str, str]]:
    """The ranks' thread settings, in this process's environment while they start (the
    elastic agent passes its own environment on); what was added is removed after."""
    add = child_defaults(os.environ, jobs=nproc)
    os.environ.update(add)
    try:
        yield add
    finally:
        for key in add:
            os.environ.pop(key, None)


@contextmanager
def parent_for_ranks() -> Iterator[None]:
    """Our pid in the environment the ranks inherit, so they die with us; removed after, so
    this process itself (a test, a notebook) never takes it for its own parent's."""
    before = os.environ.get(PARENT_ENV)
    os.environ[PARENT_ENV] = str(os.getpid())
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(PARENT_ENV, None)
        else:
            os.environ[PARENT_ENV] = before


def launch(nproc: int, args: list[str]) -> int:
    """Run ``python -m adalora_cli ARGS`` on ``nproc`` ranks, with this process's
    ``adalora_cli`` (:data:`RANK_MAIN`); the first failure's exit code."""
    from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    _quiet_agent()

    # the agent keeps each rank's error file in a folder of its own under the temp dir and
    # never removes it: a run would leave one more /tmp/torchelastic_* behind every time
    logs = DefaultLogsSpecs()
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc,
                          run_id=f"adalora-{uuid.uuid4().hex[:8]}", rdzv_backend="c10d",
                          rdzv_endpoint="localhost:0", max_restarts=0, logs_specs=logs)
    try:
        with rank_threads(nproc), parent_for_ranks():
            elastic_launch(config, entrypoint=sys.executable)("-c", RANK_MAIN, _origin(),
                                                              *args)
    except ChildFailedError as err:
        codes = [f.exitcode for f in err.failures.values()]
        if EXIT_PREEMPTED in codes:  # rank 0 checkpointed and said so; the rest were stopped
            return EXIT_PREEMPTED
        rank, failure = err.get_first_failure()
        code = failure.exitcode
        if code < 0:  # killed by a signal, so it said nothing itself: say it for it
            print(f"error: rank {rank} was killed by {_signal_name(-code)}"
                  + (" (as the out-of-memory killer does)" if -code == signal.SIGKILL else ""),
                  file=sys.stderr)
        return code if code > 0 else 128 - code  # killed by signal N: 128 + N, as a shell
    except Exception as err:
        from torch.distributed.elastic.multiprocessing.api import SignalException

        if isinstance(err, SignalException):  # stopped: the agent passed the signal on to
            return EXIT_PREEMPTED  # the ranks, and rank 0 says in one line where the run stands
        print(f"error: {type(err).__name__}: {err}", file=sys.stderr)
        return EXIT_FAILED
    finally:  # whatever the ranks' error files said was read above
        shutil.rmtree(logs.root_log_dir, ignore_errors=True)
    return 0


def _origin() -> str:
    """The file this process imported ``adalora_cli`` from (its ``__init__.py``)."""
    from .. import __file__ as init

    return os.path.abspath(init)


def cli_command(*args: str, torchrun: list[str] | None = None) -> list[str]:
    """``python -m adalora_cli ARGS`` for a child process (a sweep's run, a SLURM task), with
    this process's ``adalora_cli`` (:data:`RANK_MAIN`) rather than one in the child's current
    directory. ``torchrun``: the launcher's own options, for a run of several processes
    (``--no-python`` hands it this interpreter as the program)."""
    program = [sys.executable, "-c", RANK_MAIN, _origin(), *args]
    if torchrun is None:
        return program
    return [sys.executable, "-m", "torch.distributed.run", *torchrun, "--no-python", *program]


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
