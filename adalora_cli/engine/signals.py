"""Preemption: SIGTERM, SIGUSR1 and Ctrl-C (SIGINT) end a run with a checkpoint, marked
``preempted``.

Schedulers (SLURM's ``--signal``, Kubernetes, ``kill``) send one of these before they kill
a job. While a run owns its directory the handler only takes note, and the loop stops at
the next step boundary, where the state is whole and can be checkpointed (on several
processes, every rank agrees there to stop at the same step). An evaluation can last
minutes, longer than a scheduler's warning, so inside one the signal raises at once: the
loop then checkpoints the state from before the evaluation, which the resumed run
evaluates again. Before a run owns a directory (loading the model and data) a signal also
raises at once: there is nothing to save yet.

Ctrl-C is a stop like the others, so an interrupted run can always be resumed from where
it stopped. A second Ctrl-C while the first waits for the step boundary stops at once
(``KeyboardInterrupt``), without a checkpoint: for when a step is too long to wait for.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from ..errors import Preempted

SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)

_FIRST_CTRL_C = (b"note: stopping at the next step boundary with a checkpoint; press Ctrl-C "
                 b"again to stop at once without one\n")


def _ranks() -> int:
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


class StopSignals:
    def __init__(self) -> None:
        self.received: str | None = None
        self._deferred = False
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        if exc_type is not None and self._previous and _ranks() > 1:
            # one rank of a distributed run failed (another rank died, say): the launcher
            # stops the ranks still alive with SIGTERM as soon as it sees the first death,
            # which may land between here and this rank's one-line error; the process only
            # has that line left to say, so it lets nothing cut it (the launcher kills it
            # with SIGKILL if it ever hangs)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)

    def _handler(self, signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        if self._deferred and signum == signal.SIGINT:
            if self.received == name:  # the second Ctrl-C: the user will not wait
                raise KeyboardInterrupt
            if os.environ.get("RANK", "0") == "0":  # os.write: safe inside a handler
                os.write(2, _FIRST_CTRL_C)
        self.received = name
        if not self._deferred:
            raise Preempted(f"stopped by {self.received}")

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """Inside: a signal is only noted; the caller checks :attr:`received`."""
        previous, self._deferred = self._deferred, True
        try:
            yield
        finally:
            self._deferred = previous

    @contextmanager
    def immediate(self) -> Iterator[None]:
        """Inside: a signal raises at once (also one noted just before)."""
        previous, self._deferred = self._deferred, False
        try:
            if self.received:
                raise Preempted(f"stopped by {self.received}")
            yield
        finally:
            self._deferred = previous
