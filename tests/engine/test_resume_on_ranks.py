"""A LoRA run on an AdaLoRA run's ranks (``lora.rank_pattern``) killed and resumed: it
resumes to the uninterrupted run's files, and a source whose rank_pattern.json changed in
between is refused in one line (its digest is in the run's config.yaml)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import copy_of
from tests.engine.conftest import SMOKE, forked
from tests.test_bad_inputs import refused


@pytest.fixture(scope="module")
def source(smoke_runs, tmp_path_factory) -> Path:
    """A private copy of the smoke AdaLoRA run, so a test may change its ranks."""
    return copy_of(smoke_runs(SMOKE), tmp_path_factory.mktemp("source") / "adalora")


def _on_ranks(source: Path) -> tuple[str, ...]:
    return ("method.name=lora", f"lora.rank_pattern={source}", "train.save_every=3")


def test_a_killed_run_resumes_to_the_uninterrupted_ones_files(smoke, smoke_runs, source,
                                                              tmp_path):
    whole = smoke_runs(SMOKE, *_on_ranks(source))
    run = tmp_path / "run"
    assert forked(smoke(run, *_on_ranks(source)), fault="kill@step=10") == -9
    assert not (run / "summary.json").exists()
    assert forked(["train", "--resume", str(run), "--quiet"]) == 0
    for name in ("metrics.jsonl", "rank_pattern.json", "adapter_model.safetensors"):
        assert (run / name).read_bytes() == (whole / name).read_bytes(), name


def test_a_source_changed_before_the_resume_is_refused(smoke, source, tmp_path):
    run = tmp_path / "run"
    assert forked(smoke(run, *_on_ranks(source)), fault="kill@step=10") == -9
    changed = copy_of(source, tmp_path / "changed")  # the same run, another rank somewhere
    pattern = json.loads((changed / "rank_pattern.json").read_text())
    first = next(iter(pattern))
    pattern[first] += 1
    (source / "rank_pattern.json").write_text(json.dumps(pattern, indent=2))
    try:
        line = refused("train", "--resume", run, "--quiet")
        assert f"{source}/rank_pattern.json has changed since this run started" in line
        assert not (run / "summary.json").exists()
    finally:  # the module's other test reads the source as it was
        (source / "rank_pattern.json").write_bytes(
            (tmp_path / "changed" / "rank_pattern.json").read_bytes())
