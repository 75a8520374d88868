"""benchmarks/sweep_to_result.py run --tiny (the smoke config, 16 steps): ``adalora sweep
--jobs 2`` over three seeds against the same three runs through HF Trainer + PEFT two at a
time, in one precision, with accuracies by seed, load averages and a ratio of the walls. A
correctness check of the harness only: no timing is asserted (timings live in
`make bench` and docs/speed.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

BENCH = ROOT / "benchmarks" / "sweep_to_result.py"


def _bench(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    return subprocess.run([sys.executable, str(BENCH), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def tiny():
    done = _bench("--tiny", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.e2e
def test_both_sides_run_the_same_three_runs_in_one_precision(tiny):
    _, result = tiny
    sides = {r["side"]: r for r in result["results"]}
    assert sorted(sides) == ["hf", "ours"] and len(result["results"]) == 2  # one round
    for side in sides.values():
        assert [run["seed"] for run in side["runs"]] == [0, 1, 2]
        for run in side["runs"]:
            assert run["precision"] == "fp32"  # the smoke config pins it; Trainer is given it
            assert (run["steps"], run["final_budget"]) == (16, 24)
            assert round(run["accuracy"] * 32) == pytest.approx(run["accuracy"] * 32,
                                                                abs=1e-9)  # 32 rows
        assert side["loadavg"] >= 0 and side["load_peak"] >= side["loadavg"]


@pytest.mark.e2e
def test_trainer_runs_two_at_a_time_the_third_after_one_ends(tiny):
    _, result = tiny
    runs = next(r for r in result["results"] if r["side"] == "hf")["runs"]
    first, second, third = sorted(runs, key=lambda r: r["began"])
    assert second["began"] < first["ended"]  # the first two ran side by side
    assert third["began"] >= min(first["ended"], second["ended"])  # never three at once
    assert max(r["ended"] for r in runs) <= next(
        r for r in result["results"] if r["side"] == "hf")["wall"]


@pytest.mark.e2e
def test_printed_summary_is_the_walls_ratio_with_loads_and_accuracies(tiny):
    text, result = tiny
    s = result["summary"]
    walls = {r["side"]: r["wall"] for r in result["results"]}
    assert s["ratio"] == pytest.approx(walls["ours"] / walls["hf"])
    head = text.splitlines()[0]
    # each side's jobs get the sweep's share of the cores, both sides the same
    assert f"OMP_NUM_THREADS={max(1, (os.cpu_count() or 1) // 2)}," in head
    assert "2 at a time" in head and head.endswith("both fp32")
    line = next(x for x in text.splitlines() if x.startswith("sweep-to-result: "))
    assert f"ratio {s['ratio']:.3f} (target <= 0.7)" in line
    assert f"(load {s['ours']['loadavg']:.2f}) vs" in line
    acc = 100 * s["ours"]["accuracy"]
    assert f"accuracy {acc:.2f} ± {100 * s['ours']['accuracy_std']:.2f} % vs" in line
    rows = [x for x in text.splitlines() if "% by seed" in x]
    assert len(rows) == 2 and rows[0].lstrip().startswith("adalora sweep --jobs 2")


@pytest.mark.parametrize("args, said", [
    (["--jobs", "0"], "--jobs and --rounds take 1 or more"),
    (["--seeds", "a"], "--seeds must be integers like 0,1,2"),
    (["--tiny", "train.precision=fp64"], "train.precision")])
def test_bad_arguments_are_one_line_before_any_run(args, said):
    done = _bench(*args, timeout=120)
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
