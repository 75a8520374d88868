"""Hints that work: -h, --version, and an "already exists" error that suggests --resume
only for a run that can be resumed."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib
from typer.testing import CliRunner

from adalora_cli.cli import app
from adalora_cli.config import RunConfig
from adalora_cli.rundir.run import RunDir
from adalora_cli.rundir.summary import Summary

ROOT = Path(__file__).resolve().parent.parent
SMOKE = "configs/smoke/glue.yaml"
runner = CliRunner()


@pytest.mark.parametrize("args", [["-h"], ["train", "-h"], ["sweep", "-h"], ["report", "-h"]])
def test_dash_h_is_help(args):
    short, long = runner.invoke(app, args), runner.invoke(app, [*args[:-1], "--help"])
    assert short.exit_code == 0 and "Usage:" in short.stdout
    assert short.stdout == long.stdout


def test_version_prints_the_packages_version():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.strip() == f"adalora {declared}"


def _error(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:"), \
        result.output
    return lines[0]


def _train_into(out: Path):
    return runner.invoke(app, ["train", SMOKE, "--run-dir", str(out), "--quiet"])


def test_a_finished_run_is_not_offered_resume(tmp_path, in_repo):
    out = tmp_path / "done"
    run = RunDir.create(out, RunConfig())
    run.finish(Summary(task="rte", method="lora", total_steps=1))
    line = _error(_train_into(out))
    assert "already exists and holds a finished run; choose another --run-dir" in line
    assert "--resume" not in line


def test_an_unfinished_run_is_offered_resume(tmp_path, in_repo):
    out = tmp_path / "broken"
    RunDir.create(out, RunConfig()).fail("RuntimeError: boom")
    line = _error(_train_into(out))
    assert f"holds an unfinished run; continue it with adalora train --resume {out}" in line
    # and the suggestion works: --resume accepts that directory (it gets past the check)
    assert RunDir.check_claimable(out) is None


def test_a_folder_of_other_files_is_neither(tmp_path, in_repo):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("hello")
    line = _error(_train_into(out))
    assert "already exists and is not empty; choose another --run-dir" in line
    assert "--resume" not in line
