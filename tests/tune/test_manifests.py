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
    assert [p.stem for p in shipped] == ["tune_bbc_topic", "tune_rotten_tomatoes", "tune_smoke",
                                         "tune_table1_glue"]
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
    # 3 rates a cell, LoRA+ 3 rates x 2 ratios: the manifests' header says 54 trials
    assert sum(n_trials(c, spec) for c in cells) == 54
    lora = next(c for c in cells if c.name.endswith("lora-b72") and c.method == "lora")
    assert [s.grid() for s in lora.spaces] == [[0.0005, 0.001, 0.002]]
