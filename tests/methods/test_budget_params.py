"""What b(T) keeps, counted before training (the dry run's final-budget line)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from adalora_cli.cli import app
from adalora_cli.methods.budget_params import final_budget_params

# DeBERTaV3-base: per layer 4 attention matrices 768x768 and 2 FFN matrices 768x3072;
# an AdaLoRA triplet costs d_out + d_in + 1.
ATTN, FFN = 768 + 768 + 1, 768 + 3072 + 1


def deberta(r0: int) -> list[tuple[int, int]]:
    return [(ATTN, r0)] * 48 + [(FFN, r0)] * 24


def test_deberta_v3_base_at_the_1_2m_level():
    got = final_budget_params(deberta(12), 576)
    assert got["adapter_params_at_r0"] == 1_991_520  # what --dry-run reported before
    assert got["final_params_uniform"] == 8 * (48 * ATTN + 24 * FFN) == 1_327_680
    # cheapest: all 48 attention matrices at r0 = 12 (576 triplets)
    assert got["final_params_min"] == 576 * ATTN == 885_312
    # dearest: 24 FFN matrices at 12, the remaining 288 triplets in attention matrices
    assert got["final_params_max"] == 288 * FFN + 288 * ATTN == 1_548_864
    assert got["final_params_min"] < 1_270_000 < got["final_params_max"]  # paper: 1.27M


def test_equal_costs_make_the_final_count_exact():
    got = final_budget_params([(65, 4)] * 6, 10)
    assert got["final_params_min"] == got["final_params_max"] == 650
    assert got["final_params_uniform"] is None  # 10 / 6 is no whole rank


def test_dry_run_prints_both_counts(in_repo):
    result = CliRunner().invoke(app, ["train", "configs/smoke/glue.yaml", "--dry-run"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output.strip().splitlines()[-1])
    # tiny BERT: 8 attention matrices 32x32 (65 per triplet), 4 FFN 32x37 (70), r0 = 4
    assert info["adapter_params_at_r0"] == info["adapter_params"] == 4 * (8 * 65 + 4 * 70)
    assert (info["final_params_min"], info["final_params_max"]) == (16 * 65, 16 * 70)
    assert "b(T) = 16 keeps 1,040 to 1,120 by rank pattern" in result.output
    # b(T) over the 12 adapted matrices: the mean final rank, printed and in the JSON line
    assert info["final_mean_rank"] == round(16 / 12, 4)
    assert "mean final rank b(T)/n = 16/12 = 1.3333" in result.output
