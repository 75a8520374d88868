"""Exact resume: a run SIGKILLed anywhere and resumed ends byte-identical to one never stopped.

The smoke schedule (T = 32, t_i = 4, delta_t = 2, t_f = 8, evaluation at step 16) puts the
kill points below in every phase: the warm-up, the pruning phase both on and between mask
events, an evaluation, a checkpoint being written, and the final phase.
"""

from __future__ import annotations

import json

import pytest
import torch

from adalora_cli.engine.checkpoint import latest_checkpoint
from adalora_cli.rundir.run import RunDir, is_finished, read_metrics

from .conftest import forked, same_outputs

# every test here runs training in forked processes and kills them on purpose
pytestmark = pytest.mark.e2e


def resume_args(out):
    return ["train", "--resume", str(out), "--quiet"]


def test_killed_at_every_phase_then_resumed_is_byte_identical(smoke, tmp_path, baseline):
    out = tmp_path / "run"
    # warm-up (t <= 4), before the first checkpoint (save_every=3 saves after step 3's row)
    assert forked(smoke(out, "train.save_every=3"), "kill@step=3") == -9
    assert RunDir.read_status(out)["status"] == "running"  # SIGKILL: nobody could say more
    assert latest_checkpoint(out) is None
    kills = [
        ("kill@step=11", 9),        # pruning phase, between mask events (odd step)
        ("kill@step=14", 12),       # pruning phase, on a mask event
        ("kill@eval=16", 15),       # in the middle of the evaluation at step 16
        ("kill@checkpoint=27", 24),  # while checkpoint 27 is written: 24 stays the latest
        ("kill@step=29", 27),       # final phase
    ]
    for fault, expected_latest in kills:
        assert forked(resume_args(out), fault) == -9, fault
        assert latest_checkpoint(out).name == f"step-{expected_latest:07d}", fault
        assert not is_finished(out)
    assert forked(resume_args(out)) == 0
    assert is_finished(out)
    assert same_outputs(out, baseline) == []
    summary = json.loads((out / "summary.json").read_text())
    assert summary["attempts"] == 7 and summary["total_steps"] == 32
    assert not (out / "checkpoints").exists()  # a finished run keeps only its final weights
    steps = [r["step"] for r in read_metrics(out) if "loss" in r]
    assert steps == list(range(1, 33))  # no row lost, none written twice


def test_resume_from_a_checkpoint_every_step(smoke, tmp_path, baseline):
    """save_every=1, killed in the final phase right after a mask was re-applied."""
    out = tmp_path / "run"
    assert forked(smoke(out, "train.save_every=1"), "kill@step=25") == -9
    assert latest_checkpoint(out).name == "step-0000024"
    assert forked(resume_args(out, ) + ["train.save_every=3"]) == 0
    assert same_outputs(out, baseline) == []


def test_keep_checkpoints_keeps_the_newest(smoke, tmp_path):
    out = tmp_path / "run"
    assert forked(smoke(out, "train.save_every=2", "train.keep_checkpoints=3"),
                  "kill@step=13") == -9
    names = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert names == ["step-0000008", "step-0000010", "step-0000012"]


def test_sigterm_and_sigusr1_checkpoint_and_resume_exactly(smoke, tmp_path, baseline):
    """A signal in the middle of a step: the step completes, a checkpoint is written at
    once (save_every=3 would not have saved step 7 or 20), and the run says preempted."""
    out = tmp_path / "run"
    assert forked(smoke(out, "train.save_every=3"), "term@midstep=7") == 75
    status = RunDir.read_status(out)
    assert status["status"] == "preempted" and status["step"] == 7
    assert "SIGTERM" in status["reason"]
    assert latest_checkpoint(out).name == "step-0000007"
    assert forked(resume_args(out), "usr1@midstep=20") == 75
    assert RunDir.read_status(out)["step"] == 20
    assert "SIGUSR1" in RunDir.read_status(out)["reason"]
    assert forked(resume_args(out)) == 0
    assert same_outputs(out, baseline) == []


def test_full_disk_fails_cleanly_and_resumes(smoke, tmp_path, baseline):
    out = tmp_path / "run"
    assert forked(smoke(out, "train.save_every=3"), "enospc@checkpoint=9") == 1
    status = RunDir.read_status(out)
    assert status["status"] == "failed" and "No space left on device" in status["error"]
    assert latest_checkpoint(out).name == "step-0000006"  # the last good one stays usable
    assert not list((out / "checkpoints").glob(".partial-*"))
    assert forked(resume_args(out)) == 0
    assert same_outputs(out, baseline) == []


def test_a_resumed_run_continues_its_tensorboard_curves(smoke, tmp_path):
    """Killed after step 14 (checkpoint 12): the resumed attempt rewrites steps 13-14 and
    TensorBoard shows one curve, each step once, equal to metrics.jsonl."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    args = ("train.save_every=3", "log.to=[tensorboard]")
    assert forked(smoke(out, *args), "kill@step=14") == -9
    assert forked(resume_args(out)) == 0
    acc = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    events = acc.Scalars("train/loss")
    rows = [r for r in read_metrics(out) if "loss" in r]
    assert [e.step for e in events] == [r["step"] for r in rows] == list(range(1, 33))
    # TensorBoard keeps float32
    assert [e.value for e in events] == pytest.approx([r["loss"] for r in rows], rel=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_resume_on_cuda_matches_to_float_noise(smoke, tmp_path):
    """On CUDA the whole state is restored (CUDA RNG included), but kernels are not bitwise
    deterministic: the resumed run matches the straight one to float noise."""
    straight, killed = tmp_path / "a", tmp_path / "b"
    cuda = ("train.device=cuda", "train.precision=fp32", "train.save_every=3")
    assert forked(smoke(straight, *cuda)) == 0
    assert forked(smoke(killed, *cuda), "kill@step=14") == -9
    assert forked(resume_args(killed)) == 0
    a, b = read_metrics(straight), read_metrics(killed)
    assert [r["step"] for r in a] == [r["step"] for r in b]
    assert [r.get("loss", 0) for r in b] == pytest.approx([r.get("loss", 0) for r in a],
                                                          abs=1e-4)
    assert [r.get("budget") for r in b] == [r.get("budget") for r in a]


def test_a_signal_during_an_evaluation_checkpoints_the_step_before_it(smoke, tmp_path,
                                                                     baseline):
    """SIGTERM in the middle of the evaluation at step 16 (save_every=3 last saved 15): the
    run saves step 16 with its evaluation pending and stops; the resumed run evaluates step
    16 again, once, and ends byte-identical."""
    out = tmp_path / "run"
    assert forked(smoke(out, "train.save_every=3"), "term@eval=16") == 75
    status = RunDir.read_status(out)
    assert status["status"] == "preempted" and status["step"] == 16
    assert f"adalora train --resume {out}" in status["reason"]
    assert latest_checkpoint(out).name == "step-0000016"
    evals = [r for r in read_metrics(out) if "split" in r]
    assert [r["step"] for r in evals] == [16]  # written before the signal; cut on resume
    assert forked(resume_args(out)) == 0
    assert same_outputs(out, baseline) == []


def test_a_signal_during_the_final_evaluation_loses_nothing(smoke, tmp_path, baseline):
    out = tmp_path / "run"
    assert forked(smoke(out, "train.save_every=3"), "term@eval=32") == 75
    status = RunDir.read_status(out)
    assert status["status"] == "preempted" and status["step"] == 32
    assert latest_checkpoint(out).name == "step-0000032"
    assert forked(resume_args(out)) == 0
    assert same_outputs(out, baseline) == []
    summary = json.loads((out / "summary.json").read_text())
    assert summary["checkpoint_bytes"] > 0 and summary["attempts"] == 2
