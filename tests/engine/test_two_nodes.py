"""One run across two nodes: two ``torchrun --nnodes 2`` agents that meet at a c10d
rendezvous on 127.0.0.1, one process each, started as two hosts would start them (here both
on this machine), give the run one process gives, with plain DDP and with
``train.sharding=fsdp``. This is what each node's task of a SLURM job with ``--slurm
nodes=2`` runs (tests/slurm checks that on a real scheduler).

Dropout is off and the batch is 16 (8 a rank), so both compute the same gradients up to
float rounding; the schedule is cut to T = 12 as in test_fsdp_run.py.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from adalora_cli.rundir.run import RunDir, read_metrics

from .conftest import ROOT, SMOKE, forked

SHORT = ["train.max_steps=12", "adalora.t_init=2", "adalora.delta_t=2", "adalora.t_final=3",
         "train.eval_every=6", "train.batch_size=16"]


def train_args(model: Path, out: Path, *extra: str) -> list[str]:
    return ["train", SMOKE, f"model.name_or_path={model}", *SHORT, *extra, "--run-dir",
            str(out), "--quiet"]


def two_agents(args: list[str]) -> list[subprocess.CompletedProcess]:
    """``torchrun --nnodes 2 --nproc_per_node 1`` twice, as node 0 and node 1 would run it:
    the same command on each, the rendezvous on the first node's address."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("ADALORA_FAULT", None)
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2",
               "--nproc_per_node=1", "--rdzv_backend=c10d",
               f"--rdzv_endpoint=127.0.0.1:{port}", f"--rdzv_id={uuid.uuid4().hex[:8]}",
               "-m", "adalora_cli", *args]
    agents = [subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True) for _ in range(2)]
    done = []
    for agent in agents:
        out, err = agent.communicate(timeout=600)
        done.append(subprocess.CompletedProcess(command, agent.returncode, out, err))
    return done


@pytest.fixture(scope="module")
def one_process(no_dropout, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("one") / "run"
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        assert forked(train_args(no_dropout, out)) == 0
    finally:
        os.chdir(cwd)
    return out


@pytest.mark.e2e
@pytest.mark.parametrize("sharding", ["none", "fsdp"])
def test_two_nodes_give_the_one_process_run(sharding, no_dropout, one_process, tmp_path):
    two = tmp_path / "two"
    agents = two_agents(train_args(no_dropout, two, f"train.sharding={sharding}"))
    assert [a.returncode for a in agents] == [0, 0], [a.stderr[-2000:] for a in agents]
    # the run is one run: one directory, written by global rank 0 only
    assert sum("run directory:" in a.stdout for a in agents) == 1
    assert RunDir.read_status(two)["status"] == "finished"
    a, b = read_metrics(one_process), read_metrics(two)
    train_a, train_b = [r for r in a if "loss" in r], [r for r in b if "loss" in r]
    assert [r["step"] for r in train_b] == list(range(1, 13))
    # DDP all-reduces the same gradients; FSDP reduce-scatters them (rounding differs)
    tolerance = {"abs": 2e-6} if sharding == "none" else {"rel": 1e-3}
    assert [r["loss"] for r in train_b] == pytest.approx([r["loss"] for r in train_a],
                                                         **tolerance)
    assert [r["budget"] for r in train_b] == [r["budget"] for r in train_a]
    for name in ("rank_pattern.json", "rank_history.jsonl"):
        assert (two / name).read_text() == (one_process / name).read_text()
    w1, w2 = (load_file(p / "adapter_model.safetensors") for p in (one_process, two))
    assert sorted(w2) == sorted(w1)
    for name in w1:
        torch.testing.assert_close(w2[name], w1[name], rtol=0, atol=1e-4, msg=name)
