"""benchmarks/nf4_base.py on the causal-LM smoke model: the four bases (fp32, bf16, NF4
computed in fp32 and in bf16) train one batch each and print sizes that agree with the
bytes their tensors hold, worked out by hand below. A correctness check only: no timing is
asserted (timings live in `make bench`)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

# tiny-llama's frozen backbone linears, per layer (2 layers): q and o 32 x 32, k and v
# 16 x 32 (these split into 64-value blocks), gate, up and down 37 x 32 (these do not)
ATTENTION = [1024, 512, 512, 1024]
FFN = 3 * 37 * 32


def nf4_bytes(n: int, item: int) -> int:
    """An NF4 tensor of n values whose original dtype is ``item`` bytes wide: 4-bit codes
    (n / 2), one int8 scale per 64-value block, one factor per block of those scales (here
    all of a tensor's scales make one block: 16 or 8 of them), their mean, and the 16
    NF4 levels, the last three in the original dtype."""
    return n // 2 + n // 64 + item + item + 16 * item


@pytest.mark.e2e
def test_tiny_run_prints_each_base_and_its_size():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "nf4_base.py"),
                           "--tiny", "--rounds", "1", "--steps", "1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
                               "HF_DATASETS_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr == ""  # torchao's import reports are kept off, as in a run
    lines = done.stdout.strip().splitlines()
    head = next(x for x in lines if x.startswith("causal-LM smoke model"))
    assert "14 matrices, AdaLoRA r0 4, batch (8, " in head and "1 rounds x 1 steps, cpu" in head
    step = {}
    for arm, n4 in (("fp32", 0), ("bf16", 0), ("nf4", 8), ("nf4-bf16", 8)):
        row = next(x for x in lines if x.split()[0] == arm)
        assert f"{n4} in NF4" in row
        step[arm] = float(re.search(r"median step\s+([\d.]+) ms", row).group(1))
    fp32 = 2 * (sum(ATTENTION) + FFN) * 4
    linears = {"bf16": fp32 / 2,
               "nf4": 2 * (sum(nf4_bytes(n, 4) for n in ATTENTION) + FFN * 4),
               "nf4-bf16": 2 * (sum(nf4_bytes(n, 2) for n in ATTENTION) + FFN * 2)}
    for arm, size in linears.items():
        row = next(x for x in lines if x.startswith(f"{arm} / fp32:"))
        assert f"linears {size / fp32:.3f}," in row
        # the ratio of the printed steps (0.1 ms each) within their rounding
        ratio = float(row.rsplit(" ", 1)[1])
        expected = step[arm] / step["fp32"]
        assert abs(ratio - expected) <= expected * (0.05 / step[arm] + 0.05 / step["fp32"]) \
            + 0.0005
    assert "bf16 / fp32: base 0.500," in done.stdout  # every frozen tensor cast to bf16


def test_bad_rounds_are_one_line():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "nf4_base.py"),
                           "--rounds", "0"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2 and "--rounds and --steps take 1 or more" in done.stderr
    assert "Traceback" not in done.stderr
