"""benchmarks/fsdp_memory.py's training rounds measure what they say: each process of a
sharded round starts under exactly the glibc settings of its round (none of the user's own
in a default round, so "glibc's defaults" are the defaults), trains the model it names for
the steps asked, and reports a peak and a time for every step. No number is asserted about
memory or time: they belong to the machine (docs/training.md pastes a run's)."""

from __future__ import annotations

import os

import pytest

from tests.conftest import ROOT

TINY = {"layers": 1, "hidden": 64, "steps": 2, "batch": 2, "seq": 8}


@pytest.fixture()
def bench(monkeypatch):
    # benchmarks/ is no package; its spawned processes import the module by this path too
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import fsdp_memory

    return fsdp_memory


def test_a_default_round_starts_without_the_users_malloc_settings(bench, monkeypatch):
    monkeypatch.setenv("MALLOC_ARENA_MAX", "2")
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    with bench._environment({}):
        assert not any(k in os.environ for k in bench.MALLOC)
    with bench._environment({"MALLOC_MMAP_THRESHOLD_": "131072"}):
        assert {k: os.environ[k] for k in bench.MALLOC if k in os.environ} == {
            "MALLOC_MMAP_THRESHOLD_": "131072"}
    assert (os.environ["MALLOC_ARENA_MAX"], os.environ["MALLOC_MMAP_THRESHOLD_"]) == (
        "2", "65536")  # the user's own, back after each round


@pytest.mark.e2e  # two spawned processes, gloo
def test_a_sharded_training_round_reports_every_process(bench, monkeypatch):
    monkeypatch.setenv("MALLOC_ARENA_MAX", "2")  # the user's: not in this round
    rows = bench.measure(bench._train, 2, TINY, {"MALLOC_MMAP_THRESHOLD_": "131072"})
    model, _ = bench.build(TINY["layers"], TINY["hidden"])
    params = sum(p.numel() for p in model.parameters())
    assert [r[0] for r in rows] == [0, 1]
    for _, counted, peak, times, seen in rows:
        assert counted == params  # the sharded model's shapes are the whole model's
        assert seen == {"MALLOC_MMAP_THRESHOLD_": "131072"}
        assert peak > 0
        assert len(times) == TINY["steps"]
        assert all(wall > 0 and cpu >= system >= 0 for wall, cpu, system in times)
