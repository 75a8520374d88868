"""Fault injection for the kill-and-resume tests: ``ADALORA_FAULT=<what>@<where>=<step>``.

A real preemption can land anywhere, and a test must be able to put one exactly inside the
warm-up, between two mask events, in the middle of an evaluation or half-way through writing
a checkpoint. Unset (always, outside the tests), every call here is a dictionary lookup.

- ``kill@step=N``: SIGKILL right after optimizer step N was logged;
- ``kill@eval=N``: SIGKILL after the first split of the evaluation at step N was logged;
- ``kill@chosen=N``: SIGKILL as a run that chose step N (``train.select=best``) is about to
  score it again at the end;
- ``kill@checkpoint=N``: SIGKILL after checkpoint N's files were written, before it is
  published (a crash while writing);
- ``enospc@checkpoint=N``: writing checkpoint N fails as on a full disk;
- ``term@midstep=N`` / ``usr1@midstep=N``: the process sends itself SIGTERM / SIGUSR1 in the middle
  of optimizer step N, as a scheduler would (``term@eval=N``: during the evaluation at N);
- ``int@midstep=N`` / ``int2@midstep=N``: Ctrl-C there, once / twice in a row;
- ``<what>:R@...``: on rank R only (``kill:1@step=N``: one rank of a distributed run dies).
"""

from __future__ import annotations

import errno
import os
import signal

ENV = "ADALORA_FAULT"


def _parse() -> tuple[str, str, int] | None:
    spec = os.environ.get(ENV, "")
    if not spec:
        return None
    what, _, rest = spec.partition("@")
    where, _, step = rest.partition("=")
    what, _, rank = what.partition(":")  # kill:1 strikes rank 1 only
    if rank and os.environ.get("RANK", "0") != rank:
        return None
    return what, where, int(step)


def hit(where: str, step: int) -> None:
    """Trigger the configured fault if it is set for this point and step."""
    fault = _parse()
    if fault is None or fault[1] != where or fault[2] != step:
        return
    if fault[0] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault[0] in ("term", "usr1"):
        os.kill(os.getpid(), signal.SIGTERM if fault[0] == "term" else signal.SIGUSR1)
    if fault[0] in ("int", "int2"):
        for _ in range(1 if fault[0] == "int" else 2):
            os.kill(os.getpid(), signal.SIGINT)
    if fault[0] == "enospc":
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
