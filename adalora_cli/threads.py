"""CPU thread settings that hold up on a shared machine.

PyTorch's CPU kernels run on OpenMP threads, and GNU OpenMP's default lets an idle thread
spin for a while before it sleeps. On an idle machine that saves a wake-up; on a machine
whose cores are busy with other work the spinning threads steal the very cores the
working threads wait for: measured on this project's 2-core machine under load, 2 threads
ran a step 3x slower than 1. ``OMP_WAIT_POLICY=PASSIVE`` makes waiting threads sleep at
once, which costs little when the machine is idle and avoids the collapse when it is not.

Only settings the user has not made are filled in, and only in the environment: OpenMP
reads it once, when torch first starts its thread pool, so :func:`apply_defaults` must
run before torch is imported (the CLI calls it first thing). Sweep workers get the same
defaults through :func:`child_defaults`, plus a share of the cores when several CPU runs
share the machine.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping

WAIT_POLICY = "PASSIVE"
"""OpenMP's wait policy unless the user set ``OMP_WAIT_POLICY``."""


def child_defaults(env: Mapping[str, str], jobs: int = 1,
                   cpu_count: int | None = None) -> dict[str, str]:
    """The variables to add to ``env`` for a process that is one of ``jobs`` at once.

    ``OMP_WAIT_POLICY`` unless set; with ``jobs > 1`` also ``OMP_NUM_THREADS`` = the cores
    split evenly (at least 1), so N CPU runs do not start N x cores threads."""
    add: dict[str, str] = {}
    if "OMP_WAIT_POLICY" not in env:
        add["OMP_WAIT_POLICY"] = WAIT_POLICY
    if jobs > 1 and "OMP_NUM_THREADS" not in env:
        cores = cpu_count if cpu_count is not None else (os.cpu_count() or 1)
        add["OMP_NUM_THREADS"] = str(max(1, cores // jobs))
    return add


def apply_defaults(env: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Fill in this process's defaults (call before importing torch); returns what was set."""
    env = os.environ if env is None else env
    add = child_defaults(env)
    env.update(add)
    return add
