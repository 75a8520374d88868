"""Whole runs of the smoke config on the GPU, each command in a fresh interpreter as a user
runs it: bf16 and fp16 finish, peak GPU memory is recorded, a GPU checkpoint resumes on the
GPU (equal to the uninterrupted run) and on the CPU, a sweep shares one GPU between two
jobs, and a GPU run's PEFT export gives its logits on the CPU."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import peft
import pytest
import torch
from transformers import AutoModelForSequenceClassification

from adalora_cli.artifacts.load import load_run
from adalora_cli.rundir.run import RunDir, read_metrics
from tests.artifacts.test_export import TINY_BERT, amplify, cls_batch

from .conftest import GPU, REHEARSAL, SMOKE, adalora, on_gpu


def _train(out: Path, *overrides: str, fault: str | None = None):
    return adalora("train", SMOKE, *on_gpu(*overrides), "--run-dir", str(out), "--quiet",
                   fault=fault)


def _summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def _losses(run: Path) -> list[float]:
    return [r["loss"] for r in read_metrics(run) if "loss" in r]


@pytest.fixture(scope="module")
def fp32_run(tmp_path_factory) -> Path:
    """The uninterrupted fp32 run the resume test compares against (and the export test
    exports)."""
    out = tmp_path_factory.mktemp("gpu") / "fp32"
    proc = _train(out, "train.precision=fp32")
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_runs_finish_and_record_the_peak_gpu_memory(tmp_path, precision):
    out = tmp_path / precision
    proc = _train(out, f"train.precision={precision}")
    assert proc.returncode == 0, proc.stderr
    summary = _summary(out)
    ran = "fp32" if REHEARSAL and precision == "fp16" else precision
    assert summary["precision"]["autocast"] == ran
    assert summary["precision"]["loss_scaling"] == (ran == "fp16")
    assert summary["device"].startswith(GPU.type)
    losses = _losses(out)
    assert len(losses) == 32 and all(math.isfinite(x) for x in losses)
    assert sum(json.loads((out / "rank_pattern.json").read_text()).values()) == 16
    # torch.cuda.max_memory_allocated: the tiny model's weights, batches and activations
    # are some MiB, never nothing and never a whole GPU (a rehearsal: the process's RSS)
    assert 2**20 < summary["peak_memory_bytes"] < (2**30 if not REHEARSAL else 2**34)


def test_a_gpu_checkpoint_resumes_on_the_gpu_as_if_never_killed(fp32_run, tmp_path):
    out = tmp_path / "killed"
    killed = _train(out, "train.precision=fp32", "train.save_every=8", fault="kill@step=20")
    assert killed.returncode == -9
    assert RunDir.read_status(out)["status"] == "running"  # killed: nothing marked it
    proc = adalora("train", "--resume", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr
    # the checkpoint at step 16 held the weights, AdamW, the allocator's averages, the
    # schedules and the CUDA random state: steps 17-32 replay the uninterrupted run
    assert _losses(out) == pytest.approx(_losses(fp32_run), abs=1e-5)
    for name in ("rank_pattern.json", "rank_history.jsonl"):
        assert (out / name).read_text() == (fp32_run / name).read_text(), name
    assert _summary(out)["metrics"] == _summary(fp32_run)["metrics"]  # the same predictions


def test_a_gpu_checkpoint_resumes_on_the_cpu(tmp_path):
    out = tmp_path / "moved"
    # fp16 with loss scaling on the GPU; the CPU runs fp16 as fp32 whatever its bf16 support,
    # so the resume always changes the autocast precision (the smoke config pins fp32, and
    # auto would give bf16 again on a host CPU with native bf16)
    killed = _train(out, "train.precision=fp16", "train.save_every=8", fault="kill@step=20")
    assert killed.returncode == -9
    proc = adalora("train", "--resume", str(out), "train.device=cpu", "--quiet")
    assert proc.returncode == 0, proc.stderr
    summary = _summary(out)
    assert summary["device"] == "cpu" and summary["precision"]["autocast"] == "fp32"
    rows = [r for r in read_metrics(out) if "loss" in r]
    assert [r["step"] for r in rows] == list(range(1, 33))  # 17-20 again, nothing twice
    assert all(math.isfinite(r["loss"]) for r in rows)
    if not REHEARSAL:  # the autocast precision changed with the machine, and is recorded
        resumes = RunDir.read_status(out)["resumes"]
        assert resumes[-1]["precision"] == ["fp16", "fp32"]


def test_nproc_1_runs_on_the_gpu_and_more_processes_than_gpus_is_one_line(tmp_path):
    proc = adalora("train", SMOKE, *on_gpu(), "--nproc", "1", "--run-dir",
                   str(tmp_path / "one"), "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert _summary(tmp_path / "one")["device"].startswith(GPU.type)
    if REHEARSAL:
        return
    n = torch.cuda.device_count()
    proc = adalora("train", SMOKE, *on_gpu(), "--nproc", str(n + 1), "--run-dir",
                   str(tmp_path / "more"), "--quiet")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert f"--nproc {n + 1}" in lines[0] and f"--nproc {n}" in lines[0]
    assert not (tmp_path / "more").exists()


def test_a_sweep_of_two_jobs_shares_one_gpu(tmp_path):
    where = tmp_path / "sweep"
    proc = adalora("sweep", SMOKE, "--budget", "16", "--methods", "adalora,lora",
                   "--seeds", "0", "--jobs", "2", "--sweep-dir", str(where), "--quiet",
                   *on_gpu())
    assert proc.returncode == 0, proc.stderr
    runs = sorted(p for p in where.iterdir() if (p / "summary.json").exists())
    assert [p.name for p in runs] == ["glue-adalora-b16-s0", "glue-lora-b16-s0"]
    for run in runs:
        summary = _summary(run)
        assert summary["device"].startswith(GPU.type) and summary["peak_memory_bytes"] > 0


def test_the_peft_export_of_a_gpu_run_gives_its_logits_on_the_cpu(fp32_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(fp32_run, run)
    amplify(run, 40.0)  # a larger Delta W of the same pattern, so a wrong one shows
    proc = adalora("export", str(run), str(tmp_path / "peft"), "--format", "peft")
    assert proc.returncode == 0, proc.stderr
    batch = cls_batch()
    model, _, _ = load_run(run)  # on the CPU
    base = AutoModelForSequenceClassification.from_pretrained(TINY_BERT, num_labels=2)
    theirs = peft.PeftModel.from_pretrained(base, tmp_path / "peft").eval()
    with torch.no_grad():
        ours = model.eval()(**batch).logits
        got = theirs(**batch).logits
        with theirs.disable_adapter():
            without = theirs(**batch).logits
    assert torch.allclose(got, ours, atol=1e-5, rtol=0)
    assert (without - ours).abs().max() > 1e-2
