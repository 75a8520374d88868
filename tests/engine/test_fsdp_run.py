"""``train.sharding=fsdp`` end to end: torchrun and ``--nproc`` runs, stopped and resumed,
compared with one process, and every bad combination refused in one line.

The schedule is cut to T = 12 (mask events at steps 4, 6, 8, the final pattern from step
10, an evaluation at step 6) so a two-process run stays short on a CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from adalora_cli.cli import app
from adalora_cli.engine import checkpoint as ckpt
from adalora_cli.rundir.run import RunDir, read_metrics

from .conftest import COMPARED, ROOT, SMOKE, forked, forked_ranks

SHORT = ["train.max_steps=12", "adalora.t_init=2", "adalora.delta_t=2", "adalora.t_final=3",
         "train.eval_every=6", "train.save_every=4"]


def adalora(*argv: str, fault: str | None = None, torchrun: bool = False
            ) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("ADALORA_FAULT", None)
    if fault:
        env["ADALORA_FAULT"] = fault
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                "-m", "adalora_cli"] if torchrun else ["-m", "adalora_cli"]
    return subprocess.run([sys.executable, *launcher, *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def train_args(out: Path, *extra: str) -> list[str]:
    return ["train", SMOKE, *SHORT, *extra, "--run-dir", str(out), "--quiet"]


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


@pytest.mark.e2e
def test_torchrun_fsdp_gives_the_one_process_run(no_dropout, tmp_path):  # noqa: F811
    """The issue's bar: losses to 1e-3 (relative), budgets and rank pattern exactly, the
    final adapter weights to 1e-4; and the run directory is a whole one."""
    model = [f"model.name_or_path={no_dropout}", "train.batch_size=16"]
    one, two = tmp_path / "one", tmp_path / "two"
    os.chdir(ROOT)
    assert forked(train_args(one, *model)) == 0
    proc = adalora(*train_args(two, *model, "train.sharding=fsdp"), torchrun=True)
    assert proc.returncode == 0, proc.stderr
    a, b = read_metrics(one), read_metrics(two)
    train_a, train_b = [r for r in a if "loss" in r], [r for r in b if "loss" in r]
    assert [r["step"] for r in train_b] == list(range(1, 13))
    assert [r["loss"] for r in train_b] == pytest.approx([r["loss"] for r in train_a],
                                                         rel=1e-3)
    assert [r["budget"] for r in train_b] == [r["budget"] for r in train_a]
    assert [r["orth_reg"] for r in train_b] == pytest.approx(
        [r["orth_reg"] for r in train_a], rel=1e-3)
    for name in ("rank_pattern.json", "rank_history.jsonl"):
        assert (two / name).read_text() == (one / name).read_text()
    w1, w2 = (load_file(p / "adapter_model.safetensors") for p in (one, two))
    assert sorted(w2) == sorted(w1)  # every trained tensor, whole, under its own name
    for name in w1:
        assert w2[name].shape == w1[name].shape
        torch.testing.assert_close(w2[name], w1[name], rtol=0, atol=1e-4, msg=name)
    summary = json.loads((two / "summary.json").read_text())
    assert summary["export"]["model_class"] == "BertForSequenceClassification"
    assert summary["final_budget"] == 16
    assert not (two / "checkpoints").exists()  # a finished run keeps its weights only
    # the run directory is a whole run's: eval scores it on one process as training did
    assert cli(["eval", str(two), "--quiet"])[0] == 0
    scored = json.loads((two / "eval" / "default.json").read_text())
    assert scored["metrics"] == summary["metrics"]


@pytest.mark.e2e
def test_a_stopped_fsdp_run_resumes_byte_for_byte(tmp_path, in_repo, warm):
    """As DDP's test: SIGTERM to both ranks in the middle of step 10 (dropout on); the
    sharded checkpoint at 10 resumes on two processes into the uninterrupted run's files.
    The ranks are forked from this process (torchrun's variables, no launcher)."""
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    assert forked_ranks(train_args(straight, "train.sharding=fsdp")) == [0, 0]
    assert forked_ranks(train_args(stopped, "train.sharding=fsdp"),
                        fault="term@midstep=10") == [75, 75]
    assert RunDir.read_status(stopped)["step"] == 10
    saved = stopped / "checkpoints" / "step-0000010"
    assert sorted(p.name for p in saved.iterdir()) == ["sharded", "state.pt"]
    assert sorted(p.name for p in (saved / "sharded").iterdir()) == [
        ".metadata", "__0_0.distcp", "__1_0.distcp"]  # each rank wrote its own rows
    _, state = ckpt.load_checkpoint(saved)
    assert state["sharding"] == "fsdp" and state["optimizer"] is None and len(state["rng"]) == 2
    before = (stopped / "status.json").read_text()
    assert cli(["train", "--resume", str(stopped), "train.sharding=none"]) == (2, [
        f"error: step-0000010 of {stopped} was written sharded (train.sharding=fsdp) by 2 "
        "processes and resumes only sharded, on 2 or more; resume it with adalora train "
        f"--resume {stopped} train.sharding=fsdp --nproc 2"])
    assert (stopped / "status.json").read_text() == before
    assert forked_ranks(["train", "--resume", str(stopped), "--quiet"]) == [0, 0]
    differ = [n for n in (*COMPARED, "allocator_state.pt")
              if (straight / n).read_bytes() != (stopped / n).read_bytes()]
    assert differ == []
    assert RunDir.read_status(stopped)["status"] == "finished"


@pytest.mark.e2e
def test_bad_combinations_end_in_one_line(tmp_path, in_repo):
    one = cli(["train", SMOKE, "train.sharding=fsdp", "--run-dir", str(tmp_path / "one")])
    assert one == (2, ["error: train.sharding=fsdp shards the model across processes, but "
                       "this run has one: start it with --nproc N (N >= 2) or torchrun, or "
                       "set train.sharding=none (each process then holds the whole model)"])
    full = cli(["train", SMOKE, "method.name=full", "train.sharding=fsdp", "--nproc", "2",
                "--run-dir", str(tmp_path / "full")])  # refused before the ranks start
    assert full == (2, [
        "error: method.name=full trains and saves the whole model, which train.sharding=fsdp "
        "does not gather; use a parameter-efficient method (adalora, lora, adapters, bitfit) "
        "or set train.sharding=none (each process then holds the whole model)"])
    assert not (tmp_path / "one").exists() and not (tmp_path / "full").exists()
    # a checkpoint written whole (one process here; DDP writes the same) cannot go sharded
    run = tmp_path / "whole"
    assert forked(train_args(run), "kill@step=5") == -9
    before = (run / "status.json").read_text()
    code, lines = cli(["train", "--resume", str(run), "train.sharding=fsdp"])
    assert (code, lines) == (2, [
        f"error: step-0000004 of {run} was written whole (train.sharding=none, one process "
        "or DDP) and cannot resume sharded; resume it with train.sharding=none, or start a "
        "new run with train.sharding=fsdp"])
    assert (run / "status.json").read_text() == before


def cli(args: list[str]) -> tuple[int, list[str]]:
    """The CLI in this process: (exit code, the non-empty lines it wrote to stderr)."""
    result = CliRunner().invoke(app, args)
    return result.exit_code, error_lines(result.stderr)


@pytest.mark.slow  # four ranks on a shared 2-core machine: minutes; `make test-slow`
def test_a_sharded_checkpoint_resumes_on_four_processes(no_dropout, tmp_path, in_repo,  # noqa: F811
                                                         warm):
    """Written by two processes, resumed on four: DCP reshards the weights and the optimizer
    state exactly and the allocator's state is whole, so without dropout the run is the
    uninterrupted one up to the order in which four processes add their gradients."""
    model = [f"model.name_or_path={no_dropout}", "train.batch_size=16", "train.sharding=fsdp"]
    straight, moved = tmp_path / "straight", tmp_path / "moved"
    assert forked_ranks(train_args(straight, *model)) == [0, 0]
    assert forked_ranks(train_args(moved, *model), fault="term@midstep=10") == [75, 75]
    assert forked_ranks(["train", "--resume", str(moved), "--quiet"], nproc=4) == [0] * 4
    a, b = (read_metrics(p) for p in (straight, moved))
    train_a, train_b = [r for r in a if "loss" in r], [r for r in b if "loss" in r]
    assert [r["step"] for r in train_b] == list(range(1, 13))
    assert [r["loss"] for r in train_b] == pytest.approx([r["loss"] for r in train_a],
                                                         rel=1e-5)
    assert [r["budget"] for r in train_b] == [r["budget"] for r in train_a]
    assert [r for r in b if "loss" not in r] == [r for r in a if "loss" not in r]  # evals
    for name in ("rank_pattern.json", "rank_history.jsonl"):
        assert (moved / name).read_text() == (straight / name).read_text()
    w1, w2 = (load_file(p / "adapter_model.safetensors") for p in (straight, moved))
    for name in w1:
        torch.testing.assert_close(w2[name], w1[name], rtol=0, atol=1e-5, msg=name)
