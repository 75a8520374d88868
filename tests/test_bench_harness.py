"""The time-to-result benchmark's harness, run short on the tiny fixtures: both runners
(ours and Hugging Face Trainer + PEFT AdaLoRA) train the same rows for the same number of
steps, prune to the same budget, score the same validation rows, and report phases that add
up. A correctness check only: no timing is asserted here (timings live in `make bench`)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from adalora_cli.config import ConfigError, load_config
from tests.conftest import ROOT

BENCH = ROOT / "benchmarks"
SMOKE = ROOT / "configs" / "smoke" / "glue.yaml"
SHORT = ["adalora.budget=24", "train.max_steps=16"]  # 12 matrices: PEFT's target_r = 2


@pytest.fixture(scope="module")
def short_run():
    done = subprocess.run([sys.executable, str(BENCH / "time_to_result.py"), "--config",
                           str(SMOKE), "--seeds", "0", "--json", *SHORT], cwd=ROOT,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.e2e
def test_both_runners_run_the_same_job(short_run):
    _, result = short_run
    rows = {r["runner"]: r for r in result["rows"]}
    assert set(rows) == {"ours", "hf"}
    for r in rows.values():
        assert r["seed"] == 0 and r["steps"] == 16
        assert (r["train_examples"], r["eval_examples"]) == (64, 32)  # the fixture's rows
        assert r["final_budget"] == 24  # both pruned to b(T) = target_r 2 x 12 matrices
        assert round(r["accuracy"] * 32) == pytest.approx(r["accuracy"] * 32, abs=1e-9)


@pytest.mark.e2e
def test_phases_add_up_to_the_child_wall_time(short_run):
    _, result = short_run
    for r in result["rows"]:
        assert all(r[p] >= 0 for p in ("load", "train", "evaluate"))
        total = r["load"] + r["train"] + r["evaluate"] + r["other"]
        assert total == pytest.approx(r["wall"], abs=0.05)
        assert r["process_wall"] >= r["wall"]  # the parent also sees interpreter start-up
    summary = result["summary"]
    assert summary["wall_ratio"] == pytest.approx(
        summary["ours"]["process_wall"] / summary["hf"]["process_wall"])


@pytest.mark.e2e
def test_printed_table_names_both_runners_and_the_target(short_run):
    text, _ = short_run
    assert "adalora train" in text and "HF Trainer + PEFT" in text
    line = next(x for x in text.splitlines() if x.startswith("time-to-result:"))
    assert "target <= 0.8" in line and "one seed" in line


def test_budget_must_split_evenly_over_peft_matrices():
    spec = importlib.util.spec_from_file_location("ttr_hf", BENCH / "ttr_hf.py")
    ttr_hf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ttr_hf)
    cfg = load_config(SMOKE, ["adalora.budget=16"])
    with pytest.raises(ConfigError, match="not a multiple"):
        ttr_hf.peft_config(cfg, [f"m{i}" for i in range(12)], total=32)
    peft_cfg = ttr_hf.peft_config(load_config(SMOKE, ["adalora.budget=24"]),
                                  [f"m{i}" for i in range(12)], total=32)
    assert (peft_cfg.init_r, peft_cfg.target_r, peft_cfg.total_step) == (4, 2, 32)
    assert (peft_cfg.tinit, peft_cfg.tfinal, peft_cfg.deltaT) == (4, 8, 2)
    assert peft_cfg.orth_reg_weight == 0.1 and peft_cfg.lora_alpha == 8
