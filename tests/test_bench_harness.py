"""The time-to-result benchmark's harness, run short on the tiny fixtures: both runners
(ours and Hugging Face Trainer + PEFT AdaLoRA, by default twice: in our precision and in its
own fp32) train the same rows for the same number of steps, prune to the same budget, score
the same validation rows, and report phases that add up, ratios that are their walls'
quotients and the load average beside each. A correctness check only: no timing is
asserted here (timings live in `make bench`)."""

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


def _module(name: str):
    """A script of benchmarks/ (no package) imported by path."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _ttr(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH / "time_to_result.py"), "--config",
                           str(SMOKE), "--seeds", "0", "--json", *args, *SHORT], cwd=ROOT,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.fixture(scope="module")
def short_run():
    # ours in bf16, so like for like (Trainer bf16) and as it comes (Trainer fp32) differ
    done = _ttr("train.precision=bf16")
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.e2e
def test_both_runners_run_the_same_job(short_run):
    _, result = short_run
    rows = [(r["runner"], r["precision"]) for r in result["rows"]]
    # by default Trainer runs twice: in our precision and in its own default
    assert sorted(rows) == [("hf", "bf16"), ("hf", "fp32"), ("ours", "bf16")]
    for r in result["rows"]:
        assert r["seed"] == 0 and r["steps"] == 16
        assert (r["train_examples"], r["eval_examples"]) == (64, 32)  # the fixture's rows
        assert r["final_budget"] == 24  # both pruned to b(T) = target_r 2 x 12 matrices
        assert round(r["accuracy"] * 32) == pytest.approx(r["accuracy"] * 32, abs=1e-9)
        assert r["loadavg"] >= 0  # sampled while the run ran (Linux has a load average)


@pytest.mark.e2e
def test_phases_add_up_to_the_child_wall_time(short_run):
    _, result = short_run
    for r in result["rows"]:
        assert all(r[p] >= 0 for p in ("load", "train", "evaluate"))
        total = r["load"] + r["train"] + r["evaluate"] + r["other"]
        assert total == pytest.approx(r["wall"], abs=0.05)
        assert r["process_wall"] >= r["wall"]  # the parent also sees interpreter start-up


@pytest.mark.e2e
def test_like_for_like_and_as_it_comes_ratios(short_run):
    _, result = short_run
    s = result["summary"]
    ours = s["ours"]["process_wall"]
    assert s["precision"] == "bf16"
    assert s["like_for_like"] == pytest.approx(ours / s["hf"]["bf16"]["process_wall"])
    assert s["as_it_comes"] == pytest.approx(ours / s["hf"]["fp32"]["process_wall"])
    loads = [r["loadavg"] for r in result["rows"] if r["runner"] == "hf"
             and r["precision"] == "fp32"]
    assert s["hf"]["fp32"]["loadavg"] == pytest.approx(loads[0])


@pytest.mark.e2e
def test_printed_lines_name_both_ratios_with_their_load(short_run):
    text, result = short_run
    assert "adalora train" in text and "HF Trainer + PEFT" in text
    lines = [x for x in text.splitlines() if x.startswith("time-to-result, ")]
    assert [x.split(":")[0] for x in lines] == [
        "time-to-result, like for like (both bf16)",
        "time-to-result, as it comes (ours bf16, Trainer fp32, its default)"]
    s = result["summary"]
    for line, hf in zip(lines, (s["hf"]["bf16"], s["hf"]["fp32"])):
        assert "target <= 0.6" in line and "one seed" in line
        assert f"(load {s['ours']['loadavg']:.2f}) vs" in line
        assert f"s (load {hf['loadavg']:.2f}), ratio {hf['ratio']:.3f}" in line
    rows = [x for x in text.splitlines() if "seed 0, 16 steps" in x]
    assert len(rows) == 3
    assert sorted(x.split("%")[1].split()[0] for x in rows) == ["bf16", "bf16", "fp32"]


@pytest.mark.e2e
def test_an_fp32_run_has_one_trainer_run_for_both_ratios():
    done = _ttr()  # the smoke config pins fp32: Trainer's default is like for like
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert [(r["runner"], r["precision"]) for r in result["rows"]] == [("ours", "fp32"),
                                                                       ("hf", "fp32")]
    s = result["summary"]
    assert s["like_for_like"] == s["as_it_comes"] == pytest.approx(
        s["ours"]["process_wall"] / s["hf"]["fp32"]["process_wall"])
    line = next(x for x in done.stdout.splitlines() if x.startswith("time-to-result, "))
    assert line.startswith("time-to-result, like for like and as it comes (both fp32, "
                           "Trainer's default): ours")


@pytest.mark.parametrize("choice, ours, runs", [
    ("both", "bf16", ["bf16", "fp32"]), ("both", "fp32", ["fp32"]),
    ("same", "bf16", ["bf16"]), ("same", "fp32", ["fp32"]),
    ("fp32", "bf16", ["fp32"]), ("bf16", "fp32", ["bf16"])])
def test_trainer_choice_picks_its_precisions(choice, ours, runs):
    assert _module("time_to_result").trainer_precisions(choice, ours) == runs


@pytest.mark.parametrize("args, said", [
    (["--seeds", "0,x"], "--seeds must be integers like 0,1,2"),
    (["--trainer", "fp16"], "invalid choice: 'fp16'"),
    (["train.precision=fp64"], "train.precision")])
def test_bad_arguments_are_one_line_before_any_run(args, said):
    done = subprocess.run([sys.executable, str(BENCH / "time_to_result.py"), "--config",
                           str(SMOKE), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_load_sampler_keeps_the_load_average_seen_at_both_ends():
    sampler = _module("time_to_result").LoadSampler(every=60)  # no sample between the ends
    with sampler:
        pass
    assert len(sampler.samples) == 2 and all(x >= 0 for x in sampler.samples)
    assert sampler.mean == pytest.approx(sum(sampler.samples) / 2)
    assert sampler.peak == max(sampler.samples)


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
    ttr_hf = _module("ttr_hf")
    cfg = load_config(SMOKE, ["adalora.budget=16"])
    with pytest.raises(ConfigError, match="not a multiple"):
        ttr_hf.peft_config(cfg, [f"m{i}" for i in range(12)], total=32)
    peft_cfg = ttr_hf.peft_config(load_config(SMOKE, ["adalora.budget=24"]),
                                  [f"m{i}" for i in range(12)], total=32)
    assert (peft_cfg.init_r, peft_cfg.target_r, peft_cfg.total_step) == (4, 2, 32)
    assert (peft_cfg.tinit, peft_cfg.tfinal, peft_cfg.deltaT) == (4, 8, 2)
    assert peft_cfg.orth_reg_weight == 0.1 and peft_cfg.lora_alpha == 8
