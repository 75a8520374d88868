"""Runs of the smoke config in forked processes, so a test can SIGKILL a real training
process at an exact point (``ADALORA_FAULT``) without paying for a fresh interpreter."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

import adalora_cli.engine.loop  # noqa: F401  (imported once here, inherited by every fork)
import adalora_cli.heatmap  # noqa: F401
from adalora_cli.cli import app

ROOT = Path(__file__).resolve().parents[2]
SMOKE = str(ROOT / "configs" / "smoke" / "glue.yaml")
COMPARED = ("metrics.jsonl", "rank_history.jsonl", "rank_pattern.json",
            "adapter_model.safetensors")


def forked(args: list[str], fault: str | None = None) -> int:
    """``adalora ARGS`` in a forked child; its exit code, or -9 when a fault killed it."""
    pid = _fork_cli(args, fault)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _fork_cli(args: list[str], fault: str | None, **env: str) -> int:
    """Fork a child that runs ``adalora ARGS`` with ``env`` (and ``ADALORA_FAULT`` set or
    cleared) and exits with its code; returns the child's pid."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.environ.update(env)
            if fault:
                os.environ["ADALORA_FAULT"] = fault
            else:
                os.environ.pop("ADALORA_FAULT", None)
            code = CliRunner().invoke(app, args, catch_exceptions=False).exit_code
        finally:
            os._exit(code)
    return pid


def smoke_args(out: Path, *overrides: str) -> list[str]:
    return ["train", SMOKE, *overrides, "--run-dir", str(out), "--quiet"]


@pytest.fixture(scope="session")
def warm(smoke_runs) -> Path:
    """One smoke run trained in this process before any fork. A child forked from a parent
    that never trained first pays the lazy imports and first-use set-up of a run itself
    (3.6 s of CPU per child against 0.55 s once the parent has trained, on the smoke run);
    this run is also the uninterrupted baseline the resume tests compare against."""
    return smoke_runs(SMOKE, "train.save_every=3")


@pytest.fixture()
def smoke(in_repo, warm):
    return smoke_args


@pytest.fixture(scope="module")
def baseline(warm):
    """The smoke run uninterrupted (save_every=3), to compare resumed runs against; no fault
    to inject, so it needs no fork and comes from the session's cache (read-only)."""
    return warm


def same_outputs(a: Path, b: Path) -> list[str]:
    """The compared files that differ between two run directories."""
    return [name for name in COMPARED if (a / name).read_bytes() != (b / name).read_bytes()]


def forked_ranks(args: list[str], nproc: int = 2, fault: str | None = None) -> list[int]:
    """``adalora ARGS`` as ``nproc`` torchrun-style ranks forked from this process (the
    variables torchrun sets, a local rendezvous), without torchrun's launcher: each rank
    costs a fork, not an interpreter and its imports. Their exit codes, in rank order."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pids = [_fork_cli(args, fault, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)) for rank in range(nproc)]
    return [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]


@pytest.fixture(scope="module")
def no_dropout(tmp_path_factory) -> Path:
    """The tiny BERT with dropout off: multi-process runs then match one process exactly."""
    model = tmp_path_factory.mktemp("models") / "tiny-bert-no-dropout"
    shutil.copytree(ROOT / "tests" / "fixtures" / "tiny-bert", model)
    config = json.loads((model / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (model / "config.json").write_text(json.dumps(config))
    return model
