"""A sweep's budget level and LoRA on an AdaLoRA run's ranks (docs/sweeps.md, "LoRA on
AdaLoRA's ranks"): the level writes no ``lora.r`` (it is not read), the size says where the
ranks come from, and the seeds of one level, each on the AdaLoRA run of its own seed, are
seeds of one experiment apart from plain LoRA's."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from adalora_cli.config import ConfigError, load_config
from adalora_cli.methods.registry import config_digest
from adalora_cli.sweep.plan import load_manifest, plan

SMOKE = "configs/smoke/glue.yaml"


def _manifest(tmp_path: Path) -> Path:
    runs = [{"configs": [SMOKE], "methods": ["adalora", "lora"], "budgets": [16]}]
    runs += [{"configs": [SMOKE], "methods": ["lora"], "budgets": [16], "seeds": [seed],
              "tag": "on-ranks",
              "overrides": [f"lora.rank_pattern=runs/x/glue-adalora-b16-s{seed}"]}
             for seed in (0, 1)]
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump({"name": "x", "seeds": [0, 1], "runs": runs}))
    return path


def test_the_level_sizes_plain_lora_but_not_lora_on_ranks(in_repo, tmp_path):
    runs = {r.name: r for r in plan(load_manifest(_manifest(tmp_path)), n_cache={})}
    assert sorted(runs) == ["glue-adalora-b16-s0", "glue-adalora-b16-s1",
                            "glue-lora-b16-on-ranks-s0", "glue-lora-b16-on-ranks-s1",
                            "glue-lora-b16-s0", "glue-lora-b16-s1"]
    plain, on_ranks = runs["glue-lora-b16-s0"], runs["glue-lora-b16-on-ranks-s1"]
    # the smoke BERT's n = 12: b(T) 16 is r = 4/3, rounded to 1 for plain LoRA
    assert "lora.r=1" in plain.overrides and plain.size == "r=1"
    assert not any(o.startswith("lora.r=") for o in on_ranks.overrides)
    assert on_ranks.size == "ranks=adalora" and on_ranks.budget_level == 16
    assert "lora.rank_pattern=runs/x/glue-adalora-b16-s1" in on_ranks.overrides

    def digest(name: str) -> str:
        return config_digest(load_config(SMOKE, list(runs[name].overrides)))

    # each seed on its own seed's AdaLoRA run: seeds of one experiment, not plain LoRA's
    assert digest("glue-lora-b16-on-ranks-s0") == digest("glue-lora-b16-on-ranks-s1")
    assert digest("glue-lora-b16-on-ranks-s0") != digest("glue-lora-b16-s0")


def test_outside_a_level_each_source_is_its_own_experiment(in_repo):
    def digest(*overrides: str) -> str:
        return config_digest(load_config(SMOKE, ["method.name=lora", *overrides]))

    assert digest("lora.rank_pattern=a") != digest("lora.rank_pattern=b")
    # lora.r is not read on a run's ranks
    assert digest("lora.rank_pattern=a", "lora.r=3") == digest("lora.rank_pattern=a")
    assert digest("lora.r=3") != digest()


def test_one_group_names_each_runs_own_source_by_placeholders(in_repo, tmp_path):
    """``{seed}`` and ``{level}`` in an override: one group plans what a group per seed
    (and per level) writes out by hand."""
    by_hand = {r.name: r for r in plan(load_manifest(_manifest(tmp_path)), n_cache={})}
    runs = [{"configs": [SMOKE], "methods": ["adalora", "lora"], "budgets": [16]},
            {"configs": [SMOKE], "methods": ["lora"], "budgets": [16], "tag": "on-ranks",
             "overrides": ["lora.rank_pattern=runs/x/glue-adalora-b{level}-s{seed}"]}]
    path = tmp_path / "y.yaml"
    path.write_text(yaml.safe_dump({"name": "x", "seeds": [0, 1], "runs": runs}))
    filled = {r.name: r for r in plan(load_manifest(path), n_cache={})}
    assert filled.keys() == by_hand.keys()
    for name, run in filled.items():
        assert run.overrides == by_hand[name].overrides, name
    assert ("lora.rank_pattern=runs/x/glue-adalora-b16-s1"
            in filled["glue-lora-b16-on-ranks-s1"].overrides)


def test_a_level_placeholder_needs_a_level(in_repo, tmp_path):
    runs = [{"configs": [SMOKE], "methods": ["lora"],
             "overrides": ["lora.rank_pattern=runs/x/glue-adalora-b{level}-s{seed}"]}]
    path = tmp_path / "z.yaml"
    path.write_text(yaml.safe_dump({"name": "x", "seeds": [0], "runs": runs}))
    with pytest.raises(ConfigError, match=r"names \{level\}, but this run has no budget level"):
        plan(load_manifest(path), n_cache={})
