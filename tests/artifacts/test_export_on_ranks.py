"""``adalora export --format peft`` of LoRA on a finished AdaLoRA run's ranks: a PEFT
``LoraConfig`` folder whose ``rank_pattern`` holds each module's rank, which PEFT alone loads
with the run's logits (1e-5), and ``--format lora`` of the same run.

The run trains on the smoke AdaLoRA run's final ranks (four different ranks, and matrices
pruned to 0 with no adapter); its ``B`` is then amplified 40 times in the weights file, so a
module at the wrong rank or scale (PEFT's ``lora_alpha / r`` with one ``r``) moves the logits
far past the tolerance.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from tests.artifacts.test_export_baselines import _batch, _export, _ours, assert_peft_reproduces
from tests.conftest import copy_of

SMOKE = "configs/smoke/glue.yaml"


@pytest.fixture(scope="module")
def run(smoke_runs, tmp_path_factory) -> Path:
    adalora = smoke_runs(SMOKE)
    shared = smoke_runs(SMOKE, "method.name=lora", f"lora.rank_pattern={adalora}")
    out = copy_of(shared, tmp_path_factory.mktemp("on-ranks") / "run")
    path = out / "adapter_model.safetensors"
    state = load_file(str(path))
    save_file({k: v * 40.0 if k.endswith(".B") else v for k, v in state.items()}, str(path))
    return out


def _kept(run: Path) -> dict[str, int]:
    pattern = json.loads((run / "rank_pattern.json").read_text())
    return {path: r for path, r in pattern.items() if r > 0}


@pytest.mark.parametrize("fmt", ["peft", "lora"])
def test_the_export_loads_in_peft_alone_with_the_runs_logits(run, tmp_path, fmt):
    _export(run, fmt, tmp_path / fmt)
    config = json.loads((tmp_path / fmt / "adapter_config.json").read_text())
    kept = _kept(run)
    assert len(set(kept.values())) > 1  # several ranks: one r could not pass
    assert config["peft_type"] == "LORA" and config["r"] == max(kept.values())
    assert config["rank_pattern"] == kept and sorted(config["target_modules"]) == sorted(kept)
    # the longest paths first: PEFT takes the first key that ends a module's path
    assert [len(k) for k in config["rank_pattern"]] == sorted(map(len, kept), reverse=True)
    if fmt == "peft":  # PEFT scales module m by lora_alpha / r_m, as the run did
        assert config["lora_alpha"] == 8.0 and "alpha_pattern" not in config
    state = load_file(str(tmp_path / fmt / "adapter_model.safetensors"))
    for path, r in kept.items():
        assert state[f"base_model.model.{path}.lora_A.weight"].shape[0] == r
    batch = _batch()
    ref = _ours(run, batch)
    assert_peft_reproduces(tmp_path / fmt, batch, ref)
