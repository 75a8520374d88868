"""Shared fixtures: offline by construction, tiny models and fixture data from tests/fixtures."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

# Never reach for a hub: tests must pass with no network at all.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

# Tiny models run fastest on one thread, and several OpenMP threads spinning on a 2-core
# CI machine slow every test down by an order of magnitude.
torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def fixtures() -> Path:
    return FIXTURES


@pytest.fixture(scope="session")
def tiny_bert() -> Path:
    return FIXTURES / "tiny-bert"


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory) -> Path:
    """``tests/fixtures/tiny-llama`` as a Q4_1 GGUF file, written by the ``gguf`` package
    (tests/fixtures/make_tiny_gguf.py) once a session."""
    from tests.fixtures.make_tiny_gguf import write_tiny_gguf

    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny-llama.Q4_1.gguf")


@pytest.fixture()
def in_repo(monkeypatch):
    """Run from the repository root, as a user following the README does."""
    monkeypatch.chdir(ROOT)
    return ROOT


def _fingerprint(run: Path) -> dict[str, tuple[int, int]]:
    """(size, mtime) of every file under a run: cheap, and any rewrite changes it."""
    return {str(p.relative_to(run)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(run.rglob("*")) if p.is_file()}


class SmokeRuns:
    """Runs trained through the CLI, each distinct ``(config, overrides)`` once a session.

    Training a tiny run costs about a second, and several files need the same ones (the
    export and rescore tests both want the 12-step GLUE AdaLoRA run and the 3-step SQuAD
    LoRA run). The paths it hands out are shared: read them, never write into them; a test
    that changes a run works on a :func:`copy_of` it. Teardown fails the session if any file
    of a shared run was written after its training finished."""

    def __init__(self, root: Path):
        self.root = root
        self.runs: dict[tuple[str, tuple[str, ...]], Path] = {}
        self.prints: dict[Path, dict[str, tuple[int, int]]] = {}

    def __call__(self, config: str, *overrides: str) -> Path:
        key = (str((ROOT / config).resolve()), overrides)  # relative or absolute: one run
        if key not in self.runs:
            from typer.testing import CliRunner

            from adalora_cli.cli import app

            out = self.root / f"run-{len(self.runs)}"
            with pytest.MonkeyPatch.context() as mp:
                mp.chdir(ROOT)  # configs name their fixtures relative to the repository
                result = CliRunner().invoke(
                    app, ["train", config, *overrides, "--run-dir", str(out), "--quiet"])
            assert result.exit_code == 0, f"{config} {overrides}: {result.output}"
            self.runs[key] = out
            self.prints[out] = _fingerprint(out)
        return self.runs[key]

    def written(self) -> list[str]:
        """Shared runs whose files changed since training, as 'config overrides: files'."""
        changed = []
        for (config, overrides), run in self.runs.items():
            before, after = self.prints[run], _fingerprint(run)
            if after != before:
                names = sorted(k for k in before.keys() | after.keys()
                               if before.get(k) != after.get(k))
                what = " ".join([os.path.relpath(config, ROOT), *overrides])
                changed.append(f"{what}: {', '.join(names)}")
        return changed


@pytest.fixture(scope="session")
def smoke_runs(tmp_path_factory):
    """``smoke_runs(config, *overrides)``: the path of that run, trained once a session."""
    runs = SmokeRuns(tmp_path_factory.mktemp("smoke-runs"))
    yield runs
    changed = runs.written()
    assert not changed, f"tests wrote into shared smoke runs (use copy_of): {changed}"


def decoy_package(where: Path) -> Path:
    """An ``adalora_cli`` package in ``where`` that, imported, leaves a marker file and
    exits: a child process started there must not run it. Returns the marker's path."""
    marker = where / "decoy-imported"
    decoy = where / "adalora_cli"
    decoy.mkdir()
    for name in ("__init__.py", "__main__.py"):
        (decoy / name).write_text(f"open({str(marker)!r}, 'w').close()\n"
                                  "raise SystemExit('the decoy adalora_cli ran')\n")
    return marker


def copy_of(run: Path, dest: Path) -> Path:
    """A private, writable copy of a shared run, for a test that changes it."""
    shutil.copytree(run, dest)
    return dest
