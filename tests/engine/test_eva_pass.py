"""EVA's pass before training inside a run (engine/calibration.py): its ranks in the run
directory and in the weights that trained, the budget a sweep gives it, and the refusal of
more batches than the data holds."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file

from adalora_cli.methods.registry import method_spec
from tests.test_bad_inputs import SMOKE, SMOKE_LM, cli, refused

EVA = ("method.name=eva", "eva.r=2")


def ranks_trained(run) -> dict[str, int]:
    """Rows of each saved A: the rank each module trained at."""
    tensors = load_file(run / "adapter_model.safetensors")
    return {name.removesuffix(".A"): t.shape[0] for name, t in tensors.items()
            if name.endswith(".A")}


def test_eva_trains_on_the_glue_smoke_run_at_the_ranks_its_pass_chose(smoke_runs):
    run = smoke_runs(SMOKE, *EVA)
    pattern = json.loads((run / "rank_pattern.json").read_text())
    assert len(pattern) == 12  # 2 layers x 6 matrices of the tiny BERT
    assert sum(pattern.values()) == 12 * 2  # the budget n * r, redistributed
    assert max(pattern.values()) <= 4 and len(set(pattern.values())) > 1  # rho * r = 4
    assert ranks_trained(run) == pattern
    summary = json.loads((run / "summary.json").read_text())
    assert (run / "rank_heatmap.png").stat().st_size > 0
    # the parameter count is what trained: each module's r (d_in + d_out), d = 32 and 37
    dims = {"intermediate.dense": (32, 37), "output.dense": (37, 32)}
    counted = sum(r * sum(next((d for k, d in dims.items() if path.endswith(k)
                                and "attention" not in path), (32, 32)))
                  for path, r in pattern.items())
    assert summary["adapter_params"] == counted


def test_eva_trains_on_the_causal_lm_smoke_run(smoke_runs):
    run = smoke_runs(SMOKE_LM, *EVA)
    pattern = json.loads((run / "rank_pattern.json").read_text())
    assert len(pattern) == 14 and sum(pattern.values()) == 28
    assert ranks_trained(run) == pattern


def test_a_sweep_budget_puts_evas_total_rank_at_b_T(smoke_runs):
    assert method_spec("eva").size_overrides(30, 12) == ["eva.r=3", "eva.budget=30"]
    run = smoke_runs(SMOKE, "method.name=eva", *method_spec("eva").size_overrides(30, 12))
    pattern = json.loads((run / "rank_pattern.json").read_text())
    assert sum(pattern.values()) == 30 and max(pattern.values()) <= 6


def test_more_pass_batches_than_the_data_holds_is_refused_before_the_run(tmp_path):
    line = refused("train", SMOKE, *EVA, "eva.n_batches=9", "--run-dir", tmp_path / "run",
                   "--quiet")
    assert "eva.n_batches=9" in line and "only 8 batches of train.batch_size=8" in line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("fmt", ["peft", "lora"])
@pytest.mark.parametrize("overrides", [
    ("eva.r=2",),
    # a module given rank 0, and each module scaled by alpha / r_m
    ("eva.r=1", "eva.rho=6", "eva.adjust_scaling_factors=false"),
])
def test_the_export_loads_in_peft_alone_with_the_runs_logits(smoke_runs, tmp_path,
                                                             overrides, fmt):
    """An EVA run exports as a PEFT LoraConfig whose rank_pattern holds each module's rank
    and alpha_pattern its scale (``--format peft``: alpha_m = s_m r_m; ``--format lora``:
    the scale folded into B, alpha_m = r_m), a module at rank 0 left out of target_modules:
    PEFT alone gives the run's logits. B is amplified 40 times first, so one wrong rank or
    scale moves them far past 1e-5."""
    from safetensors.torch import save_file

    from tests.artifacts.test_export_baselines import _batch, _export, _ours, assert_peft_reproduces
    from tests.conftest import copy_of

    shared = smoke_runs(SMOKE, "method.name=eva", *overrides, "train.max_steps=4")
    run = copy_of(shared, tmp_path / "run")
    weights = run / "adapter_model.safetensors"
    state = load_file(str(weights))
    save_file({k: v * 40.0 if k.endswith(".B") else v for k, v in state.items()}, str(weights))
    ranks = json.loads((run / "rank_pattern.json").read_text())
    _export(run, fmt, tmp_path / fmt)
    config = json.loads((tmp_path / fmt / "adapter_config.json").read_text())
    kept = {p: r for p, r in ranks.items() if r > 0}
    assert config["rank_pattern"] == kept and sorted(config["target_modules"]) == sorted(kept)
    adjust = "eva.adjust_scaling_factors=false" not in overrides
    if not adjust:
        assert 0 in ranks.values()  # the case this parameter is for
    if fmt == "lora":  # the scale is in B: 1 in every module
        assert config["alpha_pattern"] == kept
    elif adjust:  # s = alpha / r = 16 / 2 = 8 in every module
        assert config["alpha_pattern"] == {p: 8.0 * r for p, r in kept.items()}
    else:  # s_m = alpha / r_m: alpha_m = alpha = 16
        assert set(config["alpha_pattern"].values()) == {16.0}
    batch = _batch()
    ref = _ours(run, batch)
    assert_peft_reproduces(tmp_path / fmt, batch, ref)


def test_the_pass_counts_in_the_runs_training_time(tmp_path, monkeypatch):
    """The method spent its pass to train: a clock the pass moves 1,000 s on shows in the
    run's train_seconds (no real time is measured)."""
    import time

    from adalora_cli.methods.eva import EVAPass

    real, offset = time.perf_counter, [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: real() + offset[0])
    end = EVAPass.end

    def slow_end(self, model):
        offset[0] += 1000.0
        return end(self, model)

    monkeypatch.setattr(EVAPass, "end", slow_end)
    result, _ = cli("train", SMOKE, *EVA, "train.max_steps=2", "--run-dir", tmp_path / "run",
                    "--quiet")
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert 1000 <= summary["train_seconds"] < 2000
