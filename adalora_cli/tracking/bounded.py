"""Each tracker's calls run on a thread of its own, and the run waits for each one a bounded
time.

A tracker is a network client, and a server that accepts connections and never answers
holds a call for as long as the client retries: MLflow's client waited over 15 minutes on
a server that answered ``/health`` and nothing else, W&B's init 90 s. Made on the training
thread, such a call holds the run, and a stop signal with it: Python runs a signal's
handler on the main thread between bytecodes, and the handler of a run that owns its
directory only notes the stop, so the stop waited for the call to return.

So every call is handed to the tracker's :class:`Worker` and the run waits at most its
bound (``log.tracker_timeout_s``); a call still running then is left behind, on a daemon
thread (it never holds the process's exit), and the fan-out drops that tracker. Once a
stop signal is pending the wait is cut to :data:`STOP_GRACE_S`, so a hung tracker delays a
stop's checkpoint at most that long.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

STOP_GRACE_S = 5.0
"""How long a tracker call may still run once a stop signal is pending: short beside a
scheduler's warning (SLURM kills 30 s after SIGTERM by default), long enough for a live
server to take a run's last points and its end."""
_POLL_S = 0.05  # how often a wait looks for a stop signal noted meanwhile


class Pending:
    """One call handed to a :class:`Worker`: done once it returned or raised."""

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]):
        self.fn, self.args = fn, args
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None

    def result(self) -> Any:
        """The call's value, or its exception raised here; waits for it without a bound."""
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.value


class Worker:
    """A daemon thread that makes the calls handed to it, one at a time, in order."""

    def __init__(self, name: str):
        self._calls: queue.SimpleQueue[Pending | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=f"tracker-{name}",
                                        daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            try:
                call.value = call.fn(*call.args)
            except BaseException as err:  # handed to whoever waits for the call
                call.error = err
            call.done.set()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Pending:
        call = Pending(fn, args)
        self._calls.put(call)
        return call

    def stop(self) -> None:
        """End the thread once the calls handed to it so far are made (a hung one: never,
        which a daemon thread may)."""
        self._calls.put(None)


def wait(done: threading.Event, limit: float, stopping: Callable[[], bool]) -> str | None:
    """Wait for ``done`` at most ``limit`` seconds, cut to :data:`STOP_GRACE_S` once
    ``stopping()`` is true; None once it is set, else why the wait ended without it."""
    deadline = time.monotonic() + limit
    why = f"no answer within {limit:g} s, log.tracker_timeout_s"
    graced = False
    while not done.is_set():
        if not graced and stopping():
            graced = True
            if time.monotonic() + STOP_GRACE_S < deadline:
                deadline = time.monotonic() + STOP_GRACE_S
                why = f"no answer within {STOP_GRACE_S:g} s of the stop signal"
        left = deadline - time.monotonic()
        if left <= 0:
            return why
        # a signal's handler runs on this (the main) thread while it waits; polling sees
        # a stop it noted, without the handler having to know about trackers
        done.wait(left if graced else min(left, _POLL_S))
    return None
