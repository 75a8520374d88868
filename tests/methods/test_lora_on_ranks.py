"""LoRA on a finished AdaLoRA run's ranks (``lora.rank_pattern=RUN_DIR``,
docs/maths.md#lora-on-adaloras-ranks): the smoke AdaLoRA run, then LoRA on its final ranks.

Each matrix trains at the rank AdaLoRA kept for it (no adapter where it kept none), so the
parameter count is sum_m r_m (d_in + d_out), computed here from the tiny BERT's config.json;
and every way the named directory can be the wrong run is refused in one line, exit 2,
before any run directory is made.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml
from torch import nn

from adalora_cli.artifacts.load import load_run
from adalora_cli.methods.lora import LoRALinear
from tests.conftest import FIXTURES, copy_of
from tests.test_bad_inputs import refused

SMOKE = "configs/smoke/glue.yaml"


@pytest.fixture(scope="module")
def adalora_run(smoke_runs) -> Path:
    return smoke_runs(SMOKE)  # AdaLoRA, b(T) 16 over 12 matrices: prunes some to rank 0


@pytest.fixture(scope="module")
def on_ranks(smoke_runs, adalora_run) -> Path:
    return smoke_runs(SMOKE, "method.name=lora", f"lora.rank_pattern={adalora_run}")


def _pattern(run: Path) -> dict[str, int]:
    return json.loads((run / "rank_pattern.json").read_text())


def _dims(path: str) -> tuple[int, int]:
    """(d_in, d_out) of a BERT matrix, from the fixture's config.json alone."""
    config = json.loads((FIXTURES / "tiny-bert" / "config.json").read_text())
    hidden, inner = config["hidden_size"], config["intermediate_size"]
    if path.endswith("intermediate.dense"):
        return hidden, inner
    if path.endswith(".output.dense") and ".attention." not in path:
        return inner, hidden
    return hidden, hidden


def test_each_matrix_trains_at_the_adalora_runs_final_rank(adalora_run, on_ranks):
    pattern = _pattern(adalora_run)
    assert 0 in pattern.values() and len(set(pattern.values()) - {0}) > 1  # a real pattern
    model, _, _ = load_run(on_ranks)
    for path, r in pattern.items():
        layer = model.get_submodule(path)
        d_in, d_out = _dims(path)
        if r == 0:  # pruned whole: no adapter at all
            assert type(layer) is nn.Linear
        else:
            assert type(layer) is LoRALinear and layer.r == r
            assert tuple(layer.A.shape) == (r, d_in) and tuple(layer.B.shape) == (d_out, r)
            assert layer.scaling == 8.0 / r  # alpha / r_m, as PEFT's rank_pattern scales


def test_the_count_is_adaloras_final_budget_in_parameters(adalora_run, on_ranks):
    pattern = _pattern(adalora_run)
    by_hand = sum(r * sum(_dims(path)) for path, r in pattern.items())
    assert by_hand == 1024  # 4 64 + 2 64 + 3 64 + 2 64 + 4 64 + 1 64 on this pattern
    ours = json.loads((on_ranks / "summary.json").read_text())
    ada = json.loads((adalora_run / "summary.json").read_text())
    assert ours["adapter_params"] == ours["final_adapter_params"] == by_hand
    # AdaLoRA's kept count holds one singular value per kept rank besides P and Q
    assert ada["final_adapter_params"] - ada["final_budget"] == by_hand
    assert ours["final_budget"] == ada["final_budget"] == sum(pattern.values()) == 16
    assert ours["final_mean_rank"] == ada["final_mean_rank"]
    assert ours["size"] == "ranks=adalora"


def test_the_run_records_its_source_and_shows_its_ranks(adalora_run, on_ranks):
    assert _pattern(on_ranks) == _pattern(adalora_run)  # the heatmap's input
    assert (on_ranks / "rank_heatmap.png").stat().st_size > 0
    lora = yaml.safe_load((on_ranks / "config.yaml").read_text())["lora"]
    digest = hashlib.sha256((adalora_run / "rank_pattern.json").read_bytes()).hexdigest()
    assert lora["rank_pattern"] == str(adalora_run.resolve())
    assert lora["rank_pattern_sha256"] == digest


def test_it_loads_without_the_adalora_run_it_came_from(adalora_run, on_ranks, tmp_path):
    run = copy_of(on_ranks, tmp_path / "run")
    moved = yaml.safe_load((run / "config.yaml").read_text())
    moved["lora"]["rank_pattern"] = str(tmp_path / "gone")
    (run / "config.yaml").write_text(yaml.safe_dump(moved))
    model, _, _ = load_run(run)
    assert {p: model.get_submodule(p).r for p, r in _pattern(adalora_run).items() if r} == {
        p: r for p, r in _pattern(adalora_run).items() if r}


def _train(tmp_path: Path, *overrides: str) -> str:
    line = refused("train", SMOKE, "method.name=lora", *overrides, "--run-dir",
                   tmp_path / "run", "--quiet")
    assert not (tmp_path / "run").exists()  # refused before any run directory
    return line


def _edited(run: Path, dest: Path, edit) -> Path:
    out = copy_of(run, dest)
    edit(out)
    return out


def test_a_run_that_is_not_adalora_is_refused(adalora_run, tmp_path):
    def to_sora(run: Path) -> None:
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        cfg["method"]["name"] = "sora"
        (run / "config.yaml").write_text(yaml.safe_dump(cfg))

    src = _edited(adalora_run, tmp_path / "src", to_sora)
    line = _train(tmp_path, f"lora.rank_pattern={src}")
    assert "is a sora run, not an AdaLoRA one" in line
    line = _train(tmp_path, f"lora.rank_pattern={tmp_path / 'nothing'}")
    assert "is not a run directory (no config.yaml)" in line


def test_an_unfinished_run_is_refused(adalora_run, tmp_path):
    src = _edited(adalora_run, tmp_path / "src", lambda run: (run / "summary.json").unlink())
    line = _train(tmp_path, f"lora.rank_pattern={src}")
    assert "is an unfinished run (no summary.json)" in line and "--resume" in line


def test_a_run_of_another_model_is_refused(adalora_run, tmp_path):
    def rename(run: Path) -> None:
        pattern = {k.replace("bert.", "roberta.", 1): v for k, v in _pattern(run).items()}
        (run / "rank_pattern.json").write_text(json.dumps(pattern))

    src = _edited(adalora_run, tmp_path / "src", rename)
    line = _train(tmp_path, f"lora.rank_pattern={src}")
    assert "holds ranks of matrices this model does not have" in line
    assert "'roberta.encoder.layer.0.attention.self.query'" in line


def test_a_run_of_other_target_modules_is_refused(adalora_run, tmp_path):
    line = _train(tmp_path, f"lora.rank_pattern={adalora_run}",
                  "method.target_modules=[query,value]")
    assert "adapted 12 matrices where method.target_modules adapts 4 here" in line


def test_rank_pattern_with_prune_is_refused(adalora_run, tmp_path):
    line = _train(tmp_path, f"lora.rank_pattern={adalora_run}", "lora.prune=true")
    assert "lora.prune would prune them again" in line


def test_a_source_changed_since_the_run_began_is_refused(adalora_run, tmp_path):
    line = _train(tmp_path, f"lora.rank_pattern={adalora_run}",
                  "lora.rank_pattern_sha256=" + "ab" * 32)
    assert "has changed since this run started (sha256 abababababab then" in line


def test_another_budget_level_than_the_sources_is_refused(adalora_run, tmp_path):
    line = _train(tmp_path, f"lora.rank_pattern={adalora_run}", "sweep.budget_level=32")
    assert "kept b(T) = 16 ranks, but this run is at budget level 32" in line
