"""The resume hint of a stopped run is a command that works as printed: the same in the
error line, status.json and the report, with ``--nproc N`` for a run of N processes. A
resume that a checkpoint cannot take is refused naming that command, and under ``--nproc``
before any rank starts.

The schedule is test_fsdp_run's short one (T = 12, a checkpoint every 4 steps).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from adalora_cli.cli import app
from adalora_cli.engine import launch
from adalora_cli.report.runs import load_run
from adalora_cli.rundir.run import RunDir, read_metrics, resume_command

from .conftest import ROOT, forked, forked_ranks
from .test_fsdp_run import train_args

pytestmark = pytest.mark.e2e  # training processes, stopped and resumed


def test_the_command_names_the_processes_and_quotes_the_path(tmp_path):
    assert resume_command(Path("runs/a")) == "adalora train --resume runs/a"
    assert resume_command(Path("runs/a"), 2) == "adalora train --resume runs/a --nproc 2"
    assert resume_command(Path("my runs/a"), 3, ["train.sharding=fsdp"]) == (
        "adalora train --resume 'my runs/a' train.sharding=fsdp --nproc 3")


def stop(out: Path, *extra: str) -> str:
    """A two-process run stopped by SIGTERM in the middle of step 10 (checkpoint at 10); the
    resume command its status.json records, checked against the report's."""
    assert forked_ranks(train_args(out, *extra), fault="term@midstep=10") == [75, 75]
    status = RunDir.read_status(out)
    assert status["status"] == "preempted" and status["processes"] == 2
    said, _, command = status["reason"].partition("; resume with ")
    assert said == "stopped by SIGTERM at step 10"  # the error line is this reason
    assert load_run(out) == f"preempted at step 10; resume with {command}"
    return command


@pytest.fixture(scope="module")
def sharded(tmp_path_factory, warm) -> Path:
    """A stopped train.sharding=fsdp run that the refusal tests only read."""
    out = tmp_path_factory.mktemp("sharded") / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        stop(out, "train.sharding=fsdp")
    return out


def cli(args: list[str]) -> tuple[int, list[str]]:
    result = CliRunner().invoke(app, args)
    return result.exit_code, [line for line in result.stderr.splitlines() if line.strip()]


def test_a_stopped_sharded_runs_hint_is_followed_as_printed(tmp_path, in_repo, warm):
    """The command, run as printed by the installed CLI, finishes the run. (A DDP run's
    hint is built by the same call from the number of processes alone.)"""
    out = tmp_path / "run"
    command = stop(out, "train.sharding=fsdp")
    assert command == f"adalora train --resume {out} --nproc 2"
    words = shlex.split(command)
    cli_script = Path(sys.executable).parent / words[0]  # the installed `adalora`
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("ADALORA_FAULT", None)
    done = subprocess.run([str(cli_script), *words[1:], "--quiet"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert RunDir.read_status(out)["status"] == "finished"
    assert [r["step"] for r in read_metrics(out) if "loss" in r] == list(range(1, 13))


def test_one_process_on_a_sharded_checkpoint_is_told_the_command(sharded, monkeypatch):
    """Without --nproc the FSDP check used to suggest train.sharding=none, which the
    checkpoint then refused; now the one line names the command that resumes it."""
    before = (sharded / "status.json").read_text()
    assert cli(["train", "--resume", str(sharded)]) == (2, [
        f"error: step-0000010 of {sharded} was written sharded (train.sharding=fsdp) by 2 "
        "processes and resumes only sharded, on 2 or more; resume it with adalora train "
        f"--resume {sharded} --nproc 2"])
    assert cli(["train", "--resume", str(sharded), "train.sharding=none"]) == (2, [
        f"error: step-0000010 of {sharded} was written sharded (train.sharding=fsdp) by 2 "
        "processes and resumes only sharded, on 2 or more; resume it with adalora train "
        f"--resume {sharded} train.sharding=fsdp --nproc 2"])
    assert (sharded / "status.json").read_text() == before


def test_nproc_refuses_the_other_sharding_before_any_rank_starts(sharded, tmp_path,
                                                                 in_repo, monkeypatch):
    monkeypatch.setattr(launch, "launch", lambda *a: pytest.fail("the ranks were started"))
    before = (sharded / "status.json").read_text()
    assert cli(["train", "--resume", str(sharded), "train.sharding=none", "--nproc", "2"]) == (
        2, [f"error: step-0000010 of {sharded} was written sharded (train.sharding=fsdp) by 2 "
            "processes and resumes only sharded, on 2 or more; resume it with adalora train "
            f"--resume {sharded} train.sharding=fsdp --nproc 2"])
    assert (sharded / "status.json").read_text() == before
    whole = tmp_path / "whole"  # a checkpoint written whole (one process; DDP's is the same)
    assert forked(train_args(whole), "kill@step=5") == -9
    assert cli(["train", "--resume", str(whole), "train.sharding=fsdp", "--nproc", "2"]) == (
        2, [f"error: step-0000004 of {whole} was written whole (train.sharding=none, one "
            "process or DDP) and cannot resume sharded; resume it with train.sharding=none, "
            "or start a new run with train.sharding=fsdp"])
