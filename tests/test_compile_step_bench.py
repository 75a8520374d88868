"""benchmarks/compile_step.py at a paper shape, narrowed (--tiny) for the CPU: each method's
line in each mode, the compile time beside the step time, and ratios that agree with the
printed steps. A correctness check only: no timing is asserted (timings live in docs/gpu.md
and docs/speed.md)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

SCRIPT = str(ROOT / "benchmarks" / "compile_step.py")
LINE = re.compile(r"^\s+(adalora|lora)\s+(eager|compile, cold cache|compile, warm cache)\s+"
                  r"first step\s+([\d.]+) s\s+median warm step\s+([\d.]+) ms(.*)$")


def _run(*args: str) -> dict:
    done = subprocess.run([sys.executable, SCRIPT, "--shape", "deberta-v3-base", "--tiny",
                           *args], cwd=ROOT, capture_output=True, text=True, timeout=1800,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("deberta-v3-base (tiny), cpu, fp32, first ")
    rows = {}
    for line in lines:
        m = LINE.match(line)
        if m:
            rows[m[1], m[2]] = (float(m[3]), float(m[4]) / 1000, m[5])
    return {"lines": lines, "rows": rows}


@pytest.mark.e2e
def test_eager_lines_for_both_methods_and_their_ratio():
    out = _run("--steps", "2", "--modes", "eager")
    rows = out["rows"]
    assert set(rows) == {("adalora", "eager"), ("lora", "eager")}
    assert all(first > 0 and warm > 0 and rest == "" for first, warm, rest in rows.values())
    ratio = next(x for x in out["lines"] if x.startswith("AdaLoRA / LoRA median warm step"))
    assert ratio.startswith("AdaLoRA / LoRA median warm step, eager: ")
    assert float(ratio.split()[-1]) == pytest.approx(
        rows["adalora", "eager"][1] / rows["lora", "eager"][1], rel=2e-3, abs=2e-3)


@pytest.mark.slow  # inductor compiles the step's C++ on the CPU: minutes on 2 cores
def test_a_compiled_line_says_its_compile_time_beside_its_step():
    out = _run("--steps", "3", "--modes", "eager,compile-cold", "--methods", "lora")
    first, warm, rest = out["rows"]["lora", "compile, cold cache"]
    said = re.search(r"compile time\s+([\d.]+) s\s+([\d.]+)x eager, (repaid after (\d+) "
                     r"steps|never repaid)", rest)
    assert said, rest
    assert float(said[1]) == pytest.approx(first - warm, abs=0.05)
    eager = out["rows"]["lora", "eager"][1]
    assert float(said[2]) == pytest.approx(warm / eager, rel=2e-3, abs=2e-3)
    if said[4]:
        assert int(said[4]) == pytest.approx((first - warm) / (eager - warm), abs=1)


def test_unknown_modes_are_one_line():
    done = subprocess.run([sys.executable, SCRIPT, "--shape", "bart-large", "--modes",
                           "eager,nope"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "unknown nope" in done.stderr
    assert "Traceback" not in done.stderr
