"""benchmarks/piece_threads.py run --tiny (the smoke model's first batch of 8 in 4 pieces):
the loop's step against its pieces run side by side on worker threads. A check of the
harness and of the side-by-side steps' results, not of their speed: no timing is asserted
(docs/speed.md says what was measured on an idle machine)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

BENCH = ROOT / "benchmarks" / "piece_threads.py"


@pytest.fixture(scope="module")
def tiny():
    done = subprocess.run([sys.executable, str(BENCH), "--tiny", "--steps", "2", "--rounds",
                           "1", "--json"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.e2e
def test_each_variant_trains_the_same_steps_to_the_same_parameters(tiny):
    """Overlapping the pieces keeps the forwards (and dropout's draws) in order and adds the
    gradients in piece order: the one-thread loop's result bit for bit. On the tiny model no
    operator is big enough to split over threads, so all four agree."""
    out, rows = tiny
    assert [r["variant"] for r in rows] == ["loop", "loop-1", "overlap", "concurrent"]
    assert len({r["hash"] for r in rows}) == 1
    assert "overlap's result equals loop-1's" in out


@pytest.mark.e2e
def test_the_ratios_are_those_of_the_printed_steps(tiny):
    out, rows = tiny
    loop = next(r["step"] for r in rows if r["variant"] == "loop")
    for r in rows:
        line = next(x for x in out.splitlines() if x.startswith(f"  {r['variant']:10s} step"))
        assert f"/ loop {r['step'] / loop:.3f}" in line


def test_bad_arguments_are_one_line():
    done = subprocess.run([sys.executable, str(BENCH), "--pieces", "1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--pieces 2 to the batch of 32" in done.stderr.strip().splitlines()[-1]
