"""Planning, ``sweep --status`` and a SLURM submission need the model's config.json only:
n, the number of adapted matrices that sizes every method at a budget level, comes from the
architecture built on the meta device, and equals what a real (weight-loading) build of the
same run adapts."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from adalora_cli.cli import app
from adalora_cli.config import ConfigError, load_config
from adalora_cli.engine.build import resolve_resources
from adalora_cli.engine.dryrun import dry_run
from adalora_cli.engine.skeleton import count_adapted
from adalora_cli.sweep.plan import build_spec, plan
from adalora_cli.sweep.runs import write_manifest

runner = CliRunner()


@pytest.mark.parametrize("config, overrides, n", [
    # tiny-bert: 2 layers x (query, key, value, attention.output.dense, intermediate.dense,
    # output.dense)
    ("configs/smoke/glue.yaml", [], 2 * 6),
    ("configs/smoke/squad.yaml", [], 2 * 6),
    ("configs/smoke/glue.yaml", ["method.target_modules=[query,value]"], 2 * 2),
    # tiny-bart: 2 encoder layers x (q, k, v, out_proj, fc1, fc2) + 2 decoder layers x
    # (self q, k, v, out_proj, cross q, k, v, out_proj, fc1, fc2)
    ("configs/smoke/summarization.yaml", [], 2 * 6 + 2 * 10),
])
def test_count_from_the_config_equals_the_count_of_a_real_build(config, overrides, n, in_repo):
    cfg = load_config(Path(config), [*overrides, "method.name=adalora"])
    assert count_adapted(resolve_resources(cfg)) == n
    assert dry_run(cfg).n_matrices == n  # today's count: the weights loaded


def test_a_warm_started_summarizer_counts_its_bart_layers(in_repo, tmp_path):
    """A BERT checkpoint under a summarization task is counted as the BART it becomes:
    tiny-bert's 2 layers give 2 encoder x 6 + 2 decoder x 10 matrices, not BERT's 12."""
    cfg = load_config(Path("configs/smoke/summarization.yaml"),
                      ["model.name_or_path=tests/fixtures/tiny-bert", "method.name=adalora"])
    assert count_adapted(resolve_resources(cfg)) == 2 * 6 + 2 * 10


def _weightless_copy(tmp_path: Path, fixtures: Path) -> Path:
    """tiny-bert with config.json and tokenizer but no weight file."""
    model = tmp_path / "no-weights"
    shutil.copytree(fixtures / "tiny-bert", model)
    (model / "model.safetensors").unlink()
    return model


def test_plan_and_status_without_the_weight_file(in_repo, tmp_path, fixtures):
    model = _weightless_copy(tmp_path, fixtures)
    spec = build_spec(Path("configs/smoke/glue.yaml"), "12,24", "adalora,lora", "0",
                      [f"model.name_or_path={model}"])
    runs = plan(spec)  # no n_cache: counted here, from config.json
    assert {(r.method, r.budget_level, r.size) for r in runs} == {
        ("adalora", 12, "r0=2"), ("adalora", 24, "r0=4"), ("lora", 12, "r=1"),
        ("lora", 24, "r=2")}  # rbar 1 and 2 on 12 matrices, as with the weights
    # a sweep submitted from here whose jobs have not started: its folder holds the manifest
    (tmp_path / "s").mkdir()
    write_manifest(spec, runs, tmp_path / "s")
    result = runner.invoke(app, ["sweep", "configs/smoke/glue.yaml",
                                 f"model.name_or_path={model}", "--budget", "12,24",
                                 "--methods", "adalora,lora", "--seeds", "0", "--status",
                                 "--sweep-dir", str(tmp_path / "s")], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "4 runs: 4 not started" in result.output


def test_an_unreadable_weight_file_is_never_opened(in_repo, tmp_path, fixtures):
    model = tmp_path / "unreadable"
    shutil.copytree(fixtures / "tiny-bert", model)
    weights = model / "model.safetensors"
    weights.write_bytes(b"not a safetensors file")  # any read of it would raise
    spec = build_spec(Path("configs/smoke/glue.yaml"), "24", "adalora", "0",
                      [f"model.name_or_path={model}"])
    assert [r.size for r in plan(spec)] == ["r0=4"]


def test_a_model_without_config_is_one_line(in_repo, tmp_path):
    (tmp_path / "empty-model").mkdir()
    spec = build_spec(Path("configs/smoke/glue.yaml"), "24", "adalora", "0",
                      [f"model.name_or_path={tmp_path / 'empty-model'}"])
    with pytest.raises(ConfigError) as e:
        plan(spec)
    assert str(e.value) == (f"model folder {tmp_path / 'empty-model'} has no config.json; set "
                            "model.name_or_path to a checkpoint folder (config.json, weights, "
                            "tokenizer), a .gguf file or a hub id")


def test_a_manifest_plans_offline(in_repo, tmp_path, fixtures):
    model = _weightless_copy(tmp_path, fixtures)
    manifest = tmp_path / "m.yaml"
    manifest.write_text(yaml.safe_dump({
        "name": "m", "overrides": [f"model.name_or_path={model}"],
        "runs": [{"configs": ["configs/smoke/glue.yaml"], "methods": ["houlsby"],
                  "budgets": [6]}]}))
    # rbar = 6 / 12 = 1/2: Houlsby d = 4 * rbar = 2
    assert [r.size for r in plan(build_spec(manifest))] == ["d=2"]


def test_one_checkpoint_under_two_task_families_is_counted_twice(in_repo, tmp_path):
    """tiny-bert is 12 matrices under GLUE but the 32 of its warm-started BART under
    summarization: one manifest with both sizes each run by its own n."""
    manifest = tmp_path / "m.yaml"
    manifest.write_text(yaml.safe_dump({"name": "m", "runs": [
        {"configs": ["configs/smoke/glue.yaml"], "methods": ["lora"], "budgets": [24]},
        {"configs": ["configs/smoke/summarization.yaml"], "methods": ["lora"],
         "budgets": [24], "overrides": ["model.name_or_path=tests/fixtures/tiny-bert"]}]}))
    sizes = {r.name: r.size for r in plan(build_spec(manifest))}
    # rbar 24 / 12 = 2 -> r 2;  24 / 32 = 0.75 -> r 1
    assert sizes == {"glue-lora-b24-s0": "r=2", "summarization-lora-b24-s0": "r=1"}


def test_a_plan_marks_the_counts_a_pass_before_training_will_change(in_repo, tmp_path):
    """EVA and GoRA choose each matrix's rank from data once training starts: the plan counts
    them at the mean rank, marked ~ with the reason; LoRA's count stands as is."""
    manifest = tmp_path / "m.yaml"
    manifest.write_text(yaml.safe_dump({
        "name": "m", "runs": [{"configs": ["configs/smoke/glue.yaml"],
                               "methods": ["eva", "lora"], "budgets": [24]}]}))
    done = runner.invoke(app, ["sweep", str(manifest), "--dry-run",
                               "--sweep-dir", str(tmp_path / "s")])
    assert done.exit_code == 0, done.output
    rows = {line.split("│")[1].strip(): line for line in done.output.splitlines()
            if line.startswith("│")}
    # tiny-bert: hidden 32, intermediate 37; 2 layers x (4 attention matrices of 32 x 32, 2
    # feed-forward of 32 x 37); r = 24 / 12 = 2: 2 x (4 x 2 x 64 + 2 x 2 x 69) = 1,576
    eva, lora = rows["glue-eva-b24-s0"], rows["glue-lora-b24-s0"]
    assert "~1,576" in eva and "1,576" in lora and "~" not in lora
    assert ("~ eva: each matrix's rank is chosen in a pass before training, under the same "
            "b(T); counted here at the mean rank") in " ".join(done.output.split())
