"""Every shipped paper and causal-LM config, run by its unchanged model and dataset ids
through the local hub for a few steps, as a user on a GPU machine with internet runs it.

The only overrides are steps (T, warm-up, the AdaLoRA schedule, evaluation cadence), sizes
(batch, sequence and summary lengths) and evaluation subsets, plus, for the causal-LM
configs, which read the user's own data, ``task.data_dir`` on a fixture folder. Each run
must end with finite losses, its task's metrics in metrics.jsonl, the number of adapted
matrices its config header (or paper table manifest) states, its data from the hub, and
fp32 adapter weights whatever dtype the checkpoint was stored in.
"""

from __future__ import annotations

import json
import math
import re

import pytest
from safetensors import safe_open

from .conftest import ROOT, read_jsonl

pytestmark = pytest.mark.mirror

FOLDERS = ("glue", "squad", "summarization", "causal_lm")
CONFIGS = sorted(p.relative_to(ROOT / "configs").as_posix()
                 for folder in FOLDERS for p in (ROOT / "configs" / folder).glob("*.yaml"))
GATED = ("meta-llama/", "google/gemma", "mistralai/")
STEPS = 4
COMMON = [f"train.max_steps={STEPS}", "train.warmup_steps=1", "adalora.t_init=1",
          "adalora.delta_t=1", "adalora.t_final=1", f"train.eval_every={STEPS}",
          "train.log_every=1", "train.batch_size=4", "train.eval_batch_size=8",
          "task.max_train_samples=16", "task.max_eval_samples=8",
          # fp32 as the smoke configs: on a CPU with native bf16, auto's bf16 rounds the tiny
          # random models' STS-B scores to one value, whose correlation is undefined
          "train.precision=fp32"]
SIZES = {
    "glue": ["task.max_length=64"],
    "squad": ["task.max_length=96", "task.doc_stride=32"],
    "summarization": ["task.max_length=64", "task.max_target_length=16",
                      "task.generation_min_length=4"],
    "causal_lm": ["task.max_length=64", "task.data_dir=tests/fixtures/causal_lm/qa"],
}
HUB_DATA = {"causal_lm/gsm8k_metamath.yaml": ["task.max_length=96", "task.max_new_tokens=8",
                                               "adalora.init_rank=4", "adalora.target_rank=2"]}
"""Causal-LM configs whose task reads its own hub datasets (PEFT's MetaMathQA -> GSM8K):
their sizes, without a local task.data_dir (r0 64 is more than the stand-in's 16-wide
v_proj, whose real width is 1024)."""
# The metrics each task reports per evaluation split (adalora_cli/tasks, docs/maths.md).
GLUE_METRICS = {"cola": ["matthews"], "stsb": ["pearson", "spearman", "corr"],
                "mrpc": ["accuracy", "f1"], "qqp": ["accuracy", "f1"]}
SQUAD_V2 = ["HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1"]
ROUGE = ["rouge1", "rouge2", "rougeL", "rougeLsum"]


def expected_metrics(config: str) -> dict[str, list[str]]:
    """``{split: [metric, ...]}`` the run must log."""
    folder, name = config.split("/")
    task = name.removesuffix(".yaml")
    if folder == "glue":
        splits = ["validation_matched", "validation_mismatched"] if task == "mnli" else \
            ["validation"]
        return dict.fromkeys(splits, GLUE_METRICS.get(task, ["accuracy"]))
    if folder == "squad":
        return {"validation": ["exact_match", "f1"] + (SQUAD_V2 if task == "squad_v2" else [])}
    if folder == "summarization":
        return {"validation": ROUGE}
    if config in HUB_DATA:
        return {"validation": ["loss", "perplexity", "accuracy"]}
    return {"validation": ["loss", "perplexity"]}


def documented_matrices(config: str) -> int:
    """n, the adapted matrices: the config header's "n = N", else the paper tables'
    manifests (72 for DeBERTaV3-base, experiments/table1_glue.yaml)."""
    found = re.search(r"n = (\d+)", (ROOT / "configs" / config).read_text())
    return int(found.group(1)) if found else 72


def model_id(config: str) -> str:
    text = (ROOT / "configs" / config).read_text()
    return re.search(r"name_or_path: (\S+)", text).group(1)


@pytest.mark.parametrize("config", CONFIGS, ids=CONFIGS)
def test_config_runs_by_its_hub_ids(local_hub, access_token, tmp_path, config):
    folder = config.split("/")[0]
    run = tmp_path / "run"
    gated = model_id(config).startswith(GATED)
    done = local_hub.run("train", f"configs/{config}", *COMMON,
                         *HUB_DATA.get(config, SIZES[folder]),
                         "--run-dir", str(run), "--quiet",
                         token=access_token if gated else None)
    assert done.returncode == 0, done.stderr[-3000:]

    rows = read_jsonl(run / "metrics.jsonl")
    losses = [r["loss"] for r in rows if "split" not in r and "loss" in r]
    assert len(losses) == STEPS and all(math.isfinite(x) for x in losses), losses
    for split, names in expected_metrics(config).items():
        logged = [r for r in rows if r.get("split") == split]
        assert logged, f"no {split} evaluation in metrics.jsonl"
        for name in names:
            assert math.isfinite(logged[-1][name]), (split, name, logged[-1])

    summary = json.loads((run / "summary.json").read_text())
    assert summary["model"] == model_id(config)
    assert summary["n_matrices"] == documented_matrices(config)
    if folder != "causal_lm" or config in HUB_DATA:  # from the hub, not a local copy
        assert summary["data"]["train_source"].startswith("hub ")
    with safe_open(str(run / "adapter_model.safetensors"), "pt") as weights:
        dtypes = {weights.get_slice(k).get_dtype() for k in weights.keys()}
    assert dtypes == {"F32"}, f"adapter weights stored as {dtypes}"
