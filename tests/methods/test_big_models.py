"""Big models: the meta-device dry run of a Llama-2-7B shape, gradient checkpointing, and the
dtype of the frozen base weights."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    BertConfig,
    BertForSequenceClassification,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
)

from adalora_cli.config import ConfigError
from adalora_cli.engine.build import cast_frozen, enable_checkpointing, no_kv_cache
from adalora_cli.engine.precision import decide
from adalora_cli.methods import apply_method
from tests.conftest import ROOT
from tests.methods._tiny import run_config

# Llama-2-7B's shape: 32 layers, hidden 4096, FFN 11008, 32 heads, vocab 32000.
LAYERS, HIDDEN, FFN = 32, 4096, 11008


@pytest.fixture(scope="module")
def llama_7b_config(tmp_path_factory) -> Path:
    """A folder holding only config.json: no weights, no tokenizer."""
    path = tmp_path_factory.mktemp("llama-2-7b-shape")
    LlamaConfig(hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
                num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
                max_position_embeddings=4096).save_pretrained(path)
    return path


def _dry_run_in_fresh_process(config: Path, *overrides: str) -> tuple[dict, int]:
    """The CLI's ``--dry-run`` in a fresh interpreter: (its JSON line, peak RSS in bytes)."""
    code = ("import resource, sys\nfrom adalora_cli.cli import app\n"
            f"sys.argv = ['adalora', 'train', 'configs/smoke/causal_lm.yaml', "
            f"'model.name_or_path={config}', *{list(overrides)!r}, '--dry-run']\n"
            "try:\n    app()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print('PEAK', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    return json.loads(lines[-2]), int(lines[-1].split()[1])


@pytest.mark.e2e
def test_lora_r8_on_a_7b_llama_is_19_988_480_without_allocating(llama_7b_config) -> None:
    info, peak = _dry_run_in_fresh_process(llama_7b_config, "method.name=lora", "lora.r=8")
    # per layer: q, k, v, o 8 (4096 + 4096); gate, up, down 8 (4096 + 11008)
    per_layer = 4 * 8 * (HIDDEN + HIDDEN) + 3 * 8 * (HIDDEN + FFN)
    assert per_layer * LAYERS == 19_988_480
    assert info["adapter_params"] == 19_988_480 and info["n_matrices"] == 7 * LAYERS
    assert info["head_params"] == 0  # the untied lm_head stays frozen
    assert info["total_params"] == 6_738_415_616 + 19_988_480  # Llama-2-7B + the adapter
    assert peak < 2 * 1024**3  # fp32 weights alone would be 27 GB


@pytest.mark.e2e
def test_adalora_dry_run_of_the_7b_shape_says_what_b_t_keeps(llama_7b_config) -> None:
    info, _ = _dry_run_in_fresh_process(llama_7b_config, "method.name=adalora",
                                        "adalora.init_rank=12", "adalora.budget=448")
    n = 7 * LAYERS
    # one triplet per matrix: d_in + d_out + 1
    triplets = LAYERS * (4 * (2 * HIDDEN + 1) + 3 * (HIDDEN + FFN + 1))
    assert info["adapter_params_at_r0"] == 12 * triplets
    assert info["final_budget"] == 448 and info["final_params_uniform"] == 2 * triplets
    assert info["n_matrices"] == n
    # b(T) = 448 keeps at least 448 of the cheapest triplets (attention, 8193 each)
    assert info["final_params_min"] == 448 * (2 * HIDDEN + 1)


def _tiny_llama(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = LlamaConfig(hidden_size=32, intermediate_size=37, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                         max_position_embeddings=64)
    return AutoModelForCausalLM.from_config(config)


def _tiny(family: str) -> torch.nn.Module:
    """Two-layer models of three families, dropout on (GPT-2's and BERT's defaults): the
    recomputation must replay the same masks."""
    torch.manual_seed(0)
    if family == "llama":
        return _tiny_llama()
    if family == "gpt2":
        return GPT2LMHeadModel(GPT2Config(n_embd=32, n_inner=37, n_layer=2, n_head=4,
                                          n_positions=64, vocab_size=64))
    return BertForSequenceClassification(BertConfig(
        hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
        vocab_size=64, max_position_embeddings=64))


def _loss_and_grads(family: str, checkpointing: bool
                    ) -> tuple[torch.Tensor, list[torch.Tensor], int]:
    model = _tiny(family)
    handle = apply_method(model, run_config("lora", lora={"r": 2}), None)
    with torch.no_grad():
        for p in handle.adapter:
            p.normal_(0.0, 0.2)
    no_kv_cache(model)  # as build_run prepares every model for training
    if checkpointing:
        enable_checkpointing(model)
    model.train()
    calls = []
    # a module inside the checkpointed layer: it runs again when the backward recomputes
    # (a pre-hook: the recompute stops early, once it has every tensor the backward needs)
    layer = {"llama": lambda: model.model.layers[0].mlp,
             "gpt2": lambda: model.transformer.h[0].mlp,
             "bert": lambda: model.bert.encoder.layer[0].intermediate}[family]()
    layer.register_forward_pre_hook(lambda *_: calls.append(1))
    ids = torch.tensor([[1, 5, 9, 33, 2, 7, 60, 4], [3, 8, 11, 40, 2, 2, 2, 2]])
    mask = torch.tensor([[1] * 8, [1] * 5 + [0] * 3])  # a padded row, as batches have
    torch.manual_seed(123)  # the same dropout masks in both runs
    if family == "bert":
        loss = model(input_ids=ids, attention_mask=mask, labels=torch.tensor([1, 0])).loss
    else:
        loss = model(input_ids=ids, attention_mask=mask,
                     labels=ids.masked_fill(mask == 0, -100)).loss
    loss.backward()
    return loss.detach(), [p.grad for p in handle.trainable], len(calls)


@pytest.mark.parametrize("family", ["llama", "gpt2", "bert"])
def test_gradient_checkpointing_recomputes_and_changes_no_gradient(family) -> None:
    """Bit for bit, as the docs say: GPT-2 differed in the last bits (5e-7) while it built
    its key/value cache in a training forward without checkpointing (checkpointing turns
    the cache off); a training forward now never builds one."""
    loss, grads, calls = _loss_and_grads(family, checkpointing=False)
    loss_ckpt, grads_ckpt, calls_ckpt = _loss_and_grads(family, checkpointing=True)
    assert (calls, calls_ckpt) == (1, 2)  # the layer ran again in the backward pass
    torch.testing.assert_close(loss_ckpt, loss, rtol=0, atol=0)
    assert len(grads) == len(grads_ckpt) > 0
    for g, h in zip(grads, grads_ckpt):
        torch.testing.assert_close(h, g, rtol=0, atol=0)


def test_checkpointing_a_model_without_support_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="does not support gradient checkpointing; set "
                                          "train.gradient_checkpointing=false"):
        enable_checkpointing(torch.nn.Linear(2, 2))


def test_base_dtype_casts_only_the_frozen_weights() -> None:
    model = _tiny_llama()
    handle = apply_method(model, run_config("adalora", adalora={"init_rank": 2}), None)
    frozen = [p for p in model.parameters() if not p.requires_grad]
    assert cast_frozen(model, torch.bfloat16) == len(frozen)
    assert {p.dtype for p in model.parameters() if not p.requires_grad} == {torch.bfloat16}
    assert {p.dtype for p in handle.trainable} == {torch.float32}


def test_base_dtype_on_cpu() -> None:
    cpu = torch.device("cpu")
    fp32 = {"precision": "fp32"}  # auto would be bf16 autocast on a CPU with native bf16
    assert decide(run_config("lora", model={"base_dtype": "auto"}, train=fp32),
                  cpu).base_dtype is torch.float32
    assert decide(run_config("lora", train=fp32), cpu).base_dtype is torch.float32
    with pytest.raises(ConfigError, match=r"model.base_dtype=bf16 needs mixed precision "
                                          r"\(CUDA, or train.precision=bf16 on a CPU\), but "
                                          r"this run has device cpu"):
        decide(run_config("lora", model={"base_dtype": "bf16"}, train=fp32), cpu)
