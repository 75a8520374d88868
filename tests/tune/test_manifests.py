"""The shipped tune manifests parse, and those on offline data plan the cells the issue asks
for: eight methods at b(T) = 72 and 288, each on its own grid, chosen on held-out rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from adalora_cli.sweep.tune.cells import plan_cells
from adalora_cli.sweep.tune.manifest import load_tune_manifest
from adalora_cli.sweep.tune.study import n_trials

EIGHT = {"adalora", "lora", "rslora", "dora", "pissa", "loraplus", "sora", "increlora"}


def test_every_tune_manifest_parses(in_repo):
    shipped = sorted(Path("experiments").glob("tune_*.yaml"))
    assert [p.stem for p in shipped] == ["tune_allocation_bbc_topic",
                                         "tune_allocation_rotten_tomatoes", "tune_bbc_topic",
                                         "tune_gsm8k_metamath", "tune_rotten_tomatoes",
                                         "tune_smoke", "tune_table1_glue"]
    for path in shipped:
        spec = load_tune_manifest(path)
        assert spec.groups and spec.select_on == "heldout", path


@pytest.mark.parametrize("name, holdout", [("tune_rotten_tomatoes", 1000),
                                           ("tune_bbc_topic", 200)])
def test_the_real_data_manifests_tune_the_eight_methods(in_repo, name, holdout):
    spec = load_tune_manifest(Path(f"experiments/{name}.yaml"))
    cells = plan_cells(spec)
    assert {(c.method, c.budget_level) for c in cells} == {
        (m, b) for m in EIGHT for b in (72, 288)}
    assert spec.seeds == [0, 1, 2] and all(c.holdout == holdout for c in cells)
    assert all(c.metric == "heldout/accuracy" for c in cells)
    # every trial runs to the end: a pruner halfway favours the rates that learn fastest
    # early (docs/tuning.md#pruning), and a pruner needs periodic evaluations these skip
    assert spec.pruner == {"name": "none"}
    assert not any(o.startswith("train.eval_every=") for c in cells for o in c.base.overrides)
    # 3 rates a cell, LoRA+ 3 rates x 2 ratios: the manifests' header says 54 trials
    assert sum(n_trials(c, spec) for c in cells) == 54
    lora = next(c for c in cells if c.name.endswith("lora-b72") and c.method == "lora")
    assert [s.grid() for s in lora.spaces] == [[0.0005, 0.001, 0.002]]


@pytest.mark.parametrize("name, stem, holdout", [
    ("tune_allocation_bbc_topic", "bbc_topic", 200),
    ("tune_allocation_rotten_tomatoes", "rotten_tomatoes", 1000)])
def test_the_allocation_manifests_match_the_eight_methods_tune(in_repo, name, stem, holdout):
    """EVA, GoRA and LoRA on AdaLoRA's ranks, tuned as the eight methods are (same held-out
    rows, pruner and seeds), each LoRA-on-ranks run on the tuned AdaLoRA run of its own
    seed and level."""
    spec = load_tune_manifest(Path(f"experiments/{name}.yaml"))
    eight = load_tune_manifest(Path(f"experiments/tune_{stem}.yaml"))
    assert (spec.seeds, spec.holdout, spec.select_on, spec.pruner, spec.sampler) == (
        eight.seeds, eight.holdout, eight.select_on, eight.pruner, eight.sampler)
    cells = {c.name: c for c in plan_cells(spec)}
    assert sorted(cells) == sorted(f"{stem}-{m}-b{b}{t}" for m, t in (
        ("eva", ""), ("gora", ""), ("lora", "-on-ranks")) for b in (72, 288))
    assert {(c.method, c.budget_level, c.group.tag) for c in cells.values()} == {
        (m, b, t) for m, t in (("eva", ""), ("gora", ""), ("lora", "on-ranks"))
        for b in (72, 288)}
    assert all(c.holdout == holdout and c.metric == "heldout/accuracy" for c in cells.values())
    assert sum(n_trials(c, spec) for c in cells.values()) == 18
    on_ranks = cells[f"{stem}-lora-b288-on-ranks"]
    source = f"lora.rank_pattern=runs/tune_{stem}/{stem}-adalora-b288-tuned-s"
    assert source + "0" in on_ranks.base.overrides  # trials train on seed 0's ranks
    runs = on_ranks.seed_runs(spec, {"train.learning_rate": 1e-3})
    assert [r.name for r in runs] == [f"{stem}-lora-b288-on-ranks-tuned-s{s}" for s in (0, 1, 2)]
    for run in runs:
        assert source + str(run.seed) in run.overrides
        assert not any(o.startswith("lora.r=") for o in run.overrides)


def test_the_gsm8k_manifest_tunes_adalora_and_lora_on_gsm8k_train_rows(in_repo):
    """PEFT's MetaMathQA -> GSM8K setup, each method on PEFT's 1e-4, an octave below and two
    above, chosen on 200 held-out GSM8K train rows at evaluations every 1000 steps."""
    spec = load_tune_manifest(Path("experiments/tune_gsm8k_metamath.yaml"))
    cells = plan_cells(spec)
    assert [(c.name, c.method, c.budget_level) for c in cells] == [
        ("gsm8k_metamath-adalora", "adalora", None), ("gsm8k_metamath-lora", "lora", None)]
    assert spec.seeds == [0, 1, 2] and spec.pruner["name"] == "median"
    for cell in cells:
        assert cell.holdout == 200 and cell.metric == "heldout/accuracy"
        assert [s.grid() for s in cell.spaces] == [[5e-5, 1e-4, 2e-4, 4e-4]]
        assert "train.eval_every=1000" in cell.base.overrides
        assert str(cell.base.config) == "configs/causal_lm/gsm8k_metamath.yaml"
    # the header's size: 8 trials, then 6 seed runs
    assert sum(n_trials(c, spec) for c in cells) == 8
    assert sum(len(c.seed_runs(spec, {"train.learning_rate": 1e-4})) for c in cells) == 6
