"""The CLI's one error boundary: each kind of exception leaves as one ``error:`` line with
its documented exit code (2 input, 1 broken, 73 busy, 75 preempted, 130 Ctrl-C, 143 a
sweep's SIGTERM), and ADALORA_DEBUG=1 shows only the unexpected ones' tracebacks."""

from __future__ import annotations

import pytest
import typer

from adalora_cli.cli.boundary import boundary, explain
from adalora_cli.config import ConfigError
from adalora_cli.errors import Preempted, RunBusy, SweepStopped

INTERRUPTED = "interrupted; the run directory is marked failed"


def marked(error: BaseException, where: str = "/runs/a") -> BaseException:
    error.run_dir = where  # what the loop sets on the directory it marked
    return error


@pytest.mark.parametrize("error, os_errors, expected", [
    (ConfigError("lora.r must be >= 1"), False, ("lora.r must be >= 1", 2)),
    (RunBusy("/runs/a is being run by process 7"), False,
     ("/runs/a is being run by process 7; wait for it, or stop that process first", 73)),
    (marked(Preempted("stopped by SIGTERM at step 3")), False,
     ("stopped by SIGTERM at step 3", 75)),
    (Preempted("stopped by SIGTERM"), False,
     ("stopped by SIGTERM before the run started; nothing was written", 75)),
    (SweepStopped(), False, ("stopped by SIGTERM; running runs were checkpointed and are "
                             "resumed when the sweep is started again", 143)),
    (KeyboardInterrupt(), False, (INTERRUPTED, 130)),
    (marked(KeyboardInterrupt()), False,
     ("interrupted; /runs/a is marked failed and has no checkpoint yet (a resume, adalora "
      "train --resume /runs/a, starts it over from step 0)", 130)),
    (marked(RuntimeError("evaluation exploded\ndetails")), False,
     ("RuntimeError: evaluation exploded (run directory marked failed: /runs/a); rerun with "
      "ADALORA_DEBUG=1 for the traceback", 1)),
    (FileNotFoundError(2, "No such file or directory", "/x/y"), False,
     ("FileNotFoundError: [Errno 2] No such file or directory: '/x/y'; rerun with "
      "ADALORA_DEBUG=1 for the traceback", 1)),
    (FileNotFoundError(2, "No such file or directory", "/x/y"), True,
     ("No such file or directory (/x/y); check the path and free disk space", 1)),
])
def test_each_exception_maps_to_its_line_and_code(error, os_errors, expected):
    assert explain(error, INTERRUPTED, os_errors) == expected


def test_the_boundary_prints_one_line_and_exits(capsys, monkeypatch):
    monkeypatch.delenv("ADALORA_DEBUG", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(typer.Exit) as exit_, boundary():
        raise ConfigError("train.device=tpu is not a device; use auto, cpu, cuda or cuda:N")
    assert exit_.value.exit_code == 2
    assert capsys.readouterr().err == ("error: train.device=tpu is not a device; use auto, "
                                       "cpu, cuda or cuda:N\n")


def test_a_command_own_exit_passes_through(capsys):
    with pytest.raises(typer.Exit) as exit_, boundary():
        raise typer.Exit(3)
    assert exit_.value.exit_code == 3 and capsys.readouterr().err == ""


def test_debug_reraises_only_the_unexpected(monkeypatch, capsys):
    monkeypatch.setenv("ADALORA_DEBUG", "1")
    with pytest.raises(ConfigError), boundary():
        raise ConfigError("bad")
    with pytest.raises(ZeroDivisionError), boundary():
        raise ZeroDivisionError("x")
    with pytest.raises(typer.Exit) as exit_, boundary():  # an outcome, not a bug
        raise RunBusy("busy")
    assert exit_.value.exit_code == 73


def test_ranks_other_than_0_stay_silent(monkeypatch, capsys):
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(typer.Exit) as exit_, boundary():
        raise ConfigError("bad")
    assert exit_.value.exit_code == 2 and capsys.readouterr().err == ""
