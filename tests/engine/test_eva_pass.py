"""EVA's pass before training inside a run (engine/calibration.py): its ranks in the run
directory and in the weights that trained, the budget a sweep gives it, and the refusal of
more batches than the data holds."""

from __future__ import annotations

import json

from safetensors.torch import load_file

from adalora_cli.methods.registry import method_spec
from tests.test_bad_inputs import SMOKE, SMOKE_LM, refused

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
