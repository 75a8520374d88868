"""CPU thread settings: fast on a machine of one's own, and holding up on a shared one.

PyTorch's CPU kernels run on OpenMP threads, and between two parallel regions a waiting
thread either spins (``OMP_WAIT_POLICY=ACTIVE``) or sleeps at once (``PASSIVE``). Which is
faster depends on whether other work wants the cores (docs/speed.md, "Threads"):

- on an idle machine a spinning thread is ready for the next region at once: the demo's
  training ran 1.7x faster with ``ACTIVE`` than with ``PASSIVE``, as its length-sorted
  pieces make many short regions;
- with other work on the cores the spinning threads steal the very cores the working ones
  wait for: with one busy process beside it on 2 cores, ``ACTIVE`` ran 2x slower.

So the policy follows the machine's load when the command starts: ``ACTIVE`` while other
work holds under half a core (the 1-minute load average), ``PASSIVE`` otherwise, or where
the system gives no load average. A sweep or a ``--nproc`` launch decides once, when it
starts, for all its processes (their own load must not turn the later ones passive), and
gives each process a share of the cores when several run at once.

Only settings the user has not made are filled in, and only in the environment: OpenMP
reads it once, when torch first starts its thread pool, so :func:`apply_defaults` must
run before torch is imported (the CLI calls it first thing).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping

BUSY_LOAD = 0.5
"""A 1-minute load average from this up means other work is on the cores: threads sleep."""


def wait_policy(load: float | None = None) -> str:
    """OpenMP's wait policy for a machine whose load average is ``load`` (None: read it)."""
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):  # no load average (Windows): the safe choice
            return "PASSIVE"
    return "PASSIVE" if load >= BUSY_LOAD else "ACTIVE"


def child_defaults(env: Mapping[str, str], jobs: int = 1, cpu_count: int | None = None,
                   load: float | None = None) -> dict[str, str]:
    """The variables to add to ``env`` for a process that is one of ``jobs`` at once.

    ``OMP_WAIT_POLICY`` unless set (from ``load``, read now when None); with ``jobs > 1``
    also ``OMP_NUM_THREADS`` = the cores split evenly (at least 1), so N CPU runs do not
    start N x cores threads."""
    add: dict[str, str] = {}
    if "OMP_WAIT_POLICY" not in env:
        add["OMP_WAIT_POLICY"] = wait_policy(load)
    if jobs > 1 and "OMP_NUM_THREADS" not in env:
        cores = cpu_count if cpu_count is not None else (os.cpu_count() or 1)
        add["OMP_NUM_THREADS"] = str(max(1, cores // jobs))
    return add


def apply_defaults(env: MutableMapping[str, str] | None = None,
                   load: float | None = None) -> dict[str, str]:
    """Fill in this process's defaults (call before importing torch); returns what was set.
    A sweep's or launcher's processes inherit the policy set here, decided once."""
    env = os.environ if env is None else env
    add = child_defaults(env, load=load)
    env.update(add)
    return add
