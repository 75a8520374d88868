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
    assert "target <= 0.6" in line and "one seed" in line
    # each row says its precision: the smoke config pins fp32, Trainer's default is fp32
    rows = [x for x in text.splitlines() if "seed 0, 16 steps" in x]
    assert len(rows) == 2 and all(" fp32 " in x for x in rows)


@pytest.mark.e2e
def test_hf_bf16_runs_trainer_with_bf16_and_says_so():
    done = subprocess.run([sys.executable, str(BENCH / "time_to_result.py"), "--config",
                           str(SMOKE), "--seeds", "0", "--json", "--hf-bf16", *SHORT],
                          cwd=ROOT,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {r["runner"]: r for r in json.loads(done.stdout.strip().splitlines()[-1])["rows"]}
    assert (rows["ours"]["precision"], rows["hf"]["precision"]) == ("fp32", "bf16")
    assert rows["hf"]["steps"] == rows["ours"]["steps"] == 16


@pytest.mark.parametrize("threads, said", [("2,x", "give whole numbers"),
                                           ("0", "thread counts of 1 or more")])
def test_cpu_bf16_threads_refuses_bad_thread_counts(threads, said):
    done = subprocess.run([sys.executable, str(BENCH / "cpu_bf16_threads.py"), "--threads",
                           threads], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and said in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow  # bf16 steps of the real demo model: minutes where bf16 is emulated
def test_cpu_bf16_threads_times_three_arms_in_a_fresh_process():
    done = subprocess.run([sys.executable, str(BENCH / "cpu_bf16_threads.py"), "--threads",
                           "1", "--rounds", "1", "--steps", "1", "--random-weights"],
                          cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert "random weights" in lines[0] and "OMP_WAIT_POLICY=" in lines[0]
    threads, fp32, bf16, ratio, base, base_ratio = lines[-1].split()
    assert threads == "1"  # the child really ran with OMP_NUM_THREADS=1
    assert float(fp32) > 0 and float(bf16) > 0 and float(base) > 0
    assert float(ratio) == pytest.approx(float(bf16) / float(fp32), abs=2e-3)
    assert float(base_ratio) == pytest.approx(float(base) / float(fp32), abs=2e-3)


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
