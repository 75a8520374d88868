"""benchmarks/busy_step.py run --tiny (the smoke model's first batch): the step profiled
idle and beside a busy process, by thread count and piece count, each arm in a fresh
process with the thread settings it names. A correctness check of the harness only: no
timing is asserted (docs/speed.md says what to run on an idle machine)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

BENCH = ROOT / "benchmarks" / "busy_step.py"


def _bench(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def tiny():
    # one thread (torch's own default here would be the cores): two processes in all
    done = _bench("--tiny", "--threads", "1", "--pieces", "1,4", "--steps", "2", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.e2e
def test_every_arm_runs_with_the_threads_policy_and_pieces_it_names(tiny):
    _, rows = tiny
    arms = [(r["machine"], r["threads"], r["pieces"], r["policy"]) for r in rows]
    assert arms == [("idle", 1, 1, "ACTIVE"), ("idle", 1, 4, "ACTIVE"),
                    ("busy 1", 1, 1, "PASSIVE"), ("busy 1", 1, 4, "PASSIVE")]


@pytest.mark.e2e
def test_pieces_split_the_batch_and_add_up_to_the_step(tiny):
    _, rows = tiny
    for r in rows:
        assert len(r["piece"]) == len(r["tokens"]) == r["pieces"]
        assert r["step"] > 0 and r["rest"] > 0 and all(t > 0 for t in r["piece"])
        if r["pieces"] == 4:  # length-sorted, each piece padded to its own longest
            assert r["tokens"] == sorted(r["tokens"], reverse=True)
    whole = next(r for r in rows if r["pieces"] == 1)
    split = next(r for r in rows if r["pieces"] == 4)
    # each piece padded to its own longest: never more positions than the whole batch
    assert sum(split["tokens"]) <= whole["tokens"][0]


@pytest.mark.e2e
def test_operator_counts_grow_with_the_pieces(tiny):
    _, rows = tiny
    for r in rows:
        assert 0 <= r["parallel_ops"] <= r["ops"] and r["voluntary"] >= 0
        assert r["involuntary"] >= 0 and r["cores_busy"] > 0
    ops = {(r["machine"], r["pieces"]): r["ops"] for r in rows}
    for machine in ("idle", "busy 1"):
        # each piece runs its own forward and backward: more operator calls per step
        assert ops[(machine, 4)] > ops[(machine, 1)]
    # the same step's operators do not depend on the machine
    assert ops[("idle", 1)] == ops[("busy 1", 1)] and ops[("idle", 4)] == ops[("busy 1", 4)]


@pytest.mark.e2e
def test_printed_rows_and_busy_over_idle_lines(tiny):
    text, rows = tiny
    printed = [x for x in text.splitlines() if " pc  step " in x]
    assert len(printed) == len(rows) == 4
    ratios = [x for x in text.splitlines() if ": busy / idle step " in x]
    assert len(ratios) == 2
    idle = next(r for r in rows if r["busy"] == 0 and r["pieces"] == 4)
    busy = next(r for r in rows if r["busy"] == 1 and r["pieces"] == 4)
    assert f"1 thread(s), 4 piece(s): busy / idle step {busy['step'] / idle['step']:.3f}" \
        in ratios


@pytest.mark.parametrize("args, said", [
    (["--threads", "2,x"], "--threads '2,x': give whole numbers"),
    (["--pieces", "0"], "--pieces '0': give counts of 1 or more"),
    (["--tiny", "--pieces", "9"], "at most the batch of 8 examples"),
    (["--steps", "0"], "--steps takes 1 or more")])
def test_bad_arguments_are_one_line_before_any_model_is_built(args, said):
    done = _bench(*args, timeout=120)
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
