"""benchmarks/llm_tokens.py on the causal-LM smoke model: the three arms (our AdaLoRA and
LoRA steps, HF Trainer + PEFT LoRA) run on one batch and print numbers that agree with each
other. A correctness check only: no timing is asserted (timings live in `make bench`)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.e2e
def test_tiny_run_prints_each_arm_and_consistent_ratios():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "llm_tokens.py"),
                           "--tiny", "--rounds", "1", "--steps", "1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
                               "HF_DATASETS_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    head = next(x for x in lines if x.startswith("causal-LM smoke model"))
    # tiny-llama: 2 layers x 7 matrices; the smoke config's r0 4, r 2, batch 8
    assert "14 matrices, AdaLoRA r0 4, LoRA r 2, batch (8, " in head
    assert "1 rounds x 1 steps, cpu" in head and head.endswith("fp32")
    tokens = int(re.search(r"\((\d+) tokens\)", head).group(1))
    assert 8 < tokens <= 8 * 128  # non-padding tokens of 8 chats of at most 128
    step, rate = {}, {}
    for arm in ("ours-adalora", "ours-lora", "hf-peft-lora"):
        row = next(x for x in lines if x.strip().startswith(arm))
        ms, per_s = re.search(r"median step\s+([\d.]+) ms\s+(\d+) tokens/s", row).groups()
        step[arm], rate[arm] = float(ms), int(per_s)
        # the step is printed to 0.1 ms: the rate lies between the tokens over the longest
        # and the shortest step that prints so (and is itself rounded to a token)
        fastest, slowest = (step[arm] - 0.05) / 1000, (step[arm] + 0.05) / 1000
        assert tokens / slowest - 1 <= rate[arm] <= tokens / fastest + 1
    def same_ratio(printed: str, num: str, den: str) -> None:
        # the steps are printed to 0.1 ms and the ratio to 0.001: the ratio of the printed
        # steps may differ from the printed ratio by their rounding, and by no more
        expected = step[num] / step[den]
        slack = expected * (0.05 / step[num] + 0.05 / step[den]) + 0.0005
        assert abs(float(printed.split()[-1]) - expected) <= slack

    same_ratio(next(x for x in lines if x.startswith("AdaLoRA / LoRA")),
               "ours-adalora", "ours-lora")
    for arm in ("ours-lora", "ours-adalora"):
        same_ratio(next(x for x in lines if x.startswith(f"{arm} / hf-peft-lora")),
                   "hf-peft-lora", arm)
    assert "train_runtime" not in done.stdout  # Trainer's own printout is left out


def test_bad_rounds_are_one_line():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "llm_tokens.py"),
                           "--rounds", "0"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "--rounds and --steps take 1 or more" in done.stderr
    assert "Traceback" not in done.stderr
