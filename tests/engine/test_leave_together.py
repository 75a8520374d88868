"""The end of a finished multi-process run: every rank waits for the others before the
process group goes (distributed.leave_together), and a rank that died meanwhile is said as
such. The exit abort this prevents is a race, checked by the FSDP torchrun test's repeats."""

from __future__ import annotations

import pytest

from adalora_cli.engine import distributed
from adalora_cli.engine.distributed import World, leave_together
from adalora_cli.errors import RankDied


def _barrier(calls: list, error: Exception | None = None):
    def barrier(*args, **kwargs):
        calls.append(args)
        if error is not None:
            raise error
    return barrier


def test_every_rank_of_a_distributed_run_waits_once_then_leaves(monkeypatch):
    calls: list = []
    monkeypatch.setattr(distributed.dist, "barrier", _barrier(calls))
    monkeypatch.setattr(distributed.dist, "destroy_process_group",
                        lambda *a, **k: calls.append("left"))
    leave_together(World(rank=1, size=2))
    assert calls == [(), "left"]


def test_one_process_waits_for_nobody(monkeypatch):
    calls: list = []
    monkeypatch.setattr(distributed.dist, "barrier", _barrier(calls))
    monkeypatch.setattr(distributed.dist, "destroy_process_group",
                        lambda *a, **k: calls.append("left"))
    leave_together(World())
    assert calls == []


def test_a_peer_that_died_meanwhile_is_said_as_such(monkeypatch):
    gone = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection "
                        "closed by peer [127.0.0.1]:29500")
    monkeypatch.setattr(distributed.dist, "barrier", _barrier([], gone))
    with pytest.raises(RankDied, match=r"another process of this 2-process run died "
                                       r"\(Connection closed by peer\), so rank 1 stopped"):
        leave_together(World(rank=1, size=2))


def test_rank_0_leaves_a_finished_run_finished_when_a_peer_is_gone(monkeypatch):
    """Rank 0 wrote the whole run before the wait: a peer gone at the end does not turn it
    into a failure (before the wait existed, rank 0 exited cleanly here too)."""
    gone = RuntimeError("Connection reset by peer")
    left: list = []
    monkeypatch.setattr(distributed.dist, "barrier", _barrier([], gone))
    monkeypatch.setattr(distributed.dist, "destroy_process_group",
                        lambda *a, **k: left.append("left"))
    leave_together(World(rank=0, size=2))  # no exception
    assert left == []  # shutdown() in the loop's finally leaves the group


def test_another_error_is_not_dressed_up(monkeypatch):
    monkeypatch.setattr(distributed.dist, "barrier", _barrier([], RuntimeError("bad tensor")))
    with pytest.raises(RuntimeError, match="^bad tensor$"):
        leave_together(World(rank=0, size=2))
