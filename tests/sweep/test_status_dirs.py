"""``adalora sweep --status`` on a folder that holds no sweep refuses in one line, instead of
listing every planned run as "not started" with exit 0."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from adalora_cli.cli import app

SMOKE = "configs/smoke/glue.yaml"


def status(where):
    return CliRunner().invoke(app, ["sweep", SMOKE, "--sweep-dir", str(where), "--status"],
                              env={"COLUMNS": "400"})


def test_a_missing_folder_is_refused(tmp_path, in_repo):
    result = status(tmp_path / "nowhere")
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"error: no sweep at {tmp_path / 'nowhere'} (it does not exist); pass --sweep-dir "
        "with the folder the sweep was started in")
    assert not (tmp_path / "nowhere").exists()


def test_a_folder_without_a_sweep_is_refused(tmp_path, in_repo):
    (tmp_path / "notes.txt").write_text("hello")
    result = status(tmp_path)
    assert result.exit_code == 2
    assert "holds no sweep (no sweep.yaml or sweep_log.jsonl)" in result.output


def test_a_run_directory_is_refused(tmp_path, in_repo):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("task: {name: sst2}\n")
    (run / "status.json").write_text(json.dumps({"status": "finished"}))
    result = status(run)
    assert result.exit_code == 2
    assert "is a run directory, not a sweep directory" in result.output


@pytest.mark.parametrize("marker", ["sweep.yaml", "sweep_log.jsonl"])
def test_a_sweep_folder_lists_its_runs(tmp_path, in_repo, marker):
    (tmp_path / marker).write_text("")
    result = status(tmp_path)
    assert result.exit_code == 0, result.output
    assert "not started" in result.output


@pytest.mark.parametrize("state", ["finished", "running"])
@pytest.mark.parametrize("mode", [[], ["--dry-run"]])
def test_a_sweep_never_goes_into_a_run_directory(tmp_path, in_repo, state, mode):
    """`train --run-dir runs/smoke` and then `sweep experiments/smoke.yaml` (whose default
    folder is runs/smoke) would put 8 runs inside a run; a report of it showed one row.
    Planned, dry or real, the sweep refuses before writing anything."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("task: {name: sst2}\n")
    (run / "status.json").write_text(json.dumps({"status": state}))
    before = sorted(p.name for p in run.iterdir())
    result = CliRunner().invoke(app, ["sweep", SMOKE, "--budget", "12", "--sweep-dir",
                                      str(run), *mode], env={"COLUMNS": "400"})
    assert result.exit_code == 2, result.output
    assert result.output.strip() == (
        f"error: {run} is a run directory, not a sweep directory (it holds a {state} run; "
        "--sweep-dir); pass --sweep-dir with another folder")
    assert sorted(p.name for p in run.iterdir()) == before
