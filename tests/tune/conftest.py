"""Tunes of the smoke config with their trials trained in this process (or a fork of it):
``adalora tune`` itself starts each trial as a fresh ``adalora train`` (seconds of imports
each, most of a smoke run's cost), which tests/sweep covers; here the search, its records
and its resumption are what is tested, so a launcher that trains in-process stands in."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

from adalora_cli.cli import app
from adalora_cli.errors import EXIT_PRUNED
from adalora_cli.sweep.runs import Outcome, run_state
from adalora_cli.sweep.tune.command import TuneRequest, run_tune

ROOT = Path(__file__).resolve().parents[2]
SMOKE_TUNE = ROOT / "experiments" / "tune_smoke.yaml"


class InProcess:
    """The launcher protocol of adalora_cli.sweep.launch, training each run in this
    process: started, resumed (an unfinished run directory) or left alone (ended)."""

    name = "local"
    processes_per_run = 1

    def __init__(self):
        self.trained: list[str] = []

    def launch(self, spec, runs, sweep_dir: Path, quiet: bool = False) -> list[Outcome]:
        outcomes = []
        for run in runs:
            path = sweep_dir / run.name
            state = run_state(path)
            if state in ("finished", "pruned"):
                outcomes.append(Outcome(run, "skipped" if state == "finished" else "pruned"))
                continue
            args = (["train", "--resume", str(path), "--quiet"] if state == "unfinished" else
                    ["train", str(run.config), *run.overrides, "--run-dir", str(path),
                     "--quiet"])
            code = CliRunner().invoke(app, args).exit_code
            self.trained.append(run.name)
            status = {0: "finished", EXIT_PRUNED: "pruned"}.get(code, "failed")
            outcomes.append(Outcome(run, status, error=f"exit {code}"))
        return outcomes


def manifest(tmp_path: Path, name: str = "tune_smoke", **changes) -> Path:
    """experiments/tune_smoke.yaml with ``changes`` to its top-level keys (``runs0`` for
    keys of its first group), written into ``tmp_path``."""
    data = yaml.safe_load(SMOKE_TUNE.read_text())
    data["name"] = name
    group = changes.pop("runs0", {})
    data["runs"][0].update(group)
    data.update(changes)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def tune(path: Path, where: Path, launcher=None, *overrides: str) -> tuple[int, str]:
    """``adalora tune PATH --sweep-dir WHERE --quiet`` in this process; (code, output)."""
    text = io.StringIO()
    console = Console(file=text, width=200)
    code = run_tune(TuneRequest(path, list(overrides), sweep_dir=where, quiet=True),
                    console, console, launcher or InProcess())
    return code, text.getvalue()


@pytest.fixture(scope="module")
def smoke_tune(tmp_path_factory):
    """The smoke manifest's three methods and 4-point grid, tuned uninterrupted on seed 0
    (one seed run each), from the repository root as a user runs it."""
    tmp = tmp_path_factory.mktemp("tune")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        path = manifest(tmp, seeds=[0])
        launcher = InProcess()
        code, output = tune(path, tmp / "sweep", launcher)
    assert code == 0, output
    shutil.copy(path, tmp / "sweep" / "manifest.yaml")  # for --status
    return tmp / "sweep", launcher, output
