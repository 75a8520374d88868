"""Default targets for every supported family: every attention and FFN matrix, counted by hand.

The tiny models come from ``_families.py`` (meta device: shapes only, nothing allocated)."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.pytorch_utils import Conv1D

from adalora_cli.config import ConfigError
from adalora_cli.methods import apply_method
from adalora_cli.methods.inject import adapter_sites, resolve_targets
from adalora_cli.methods.targets import ADAPTER_SITES, DEFAULT_TARGETS
from tests.methods._families import ENCODER_DECODERS, FAMILIES, FFN, HIDDEN, LAYERS, tiny_model
from tests.methods._tiny import run_config

ISSUE_FAMILIES = ["bert", "roberta", "xlm-roberta", "deberta", "deberta-v2", "distilbert",
                  "electra", "albert", "mpnet", "bart", "mbart", "pegasus", "t5", "mt5",
                  "gpt2", "gpt_neox", "opt", "llama", "mistral", "qwen2", "qwen3", "gemma",
                  "gemma2", "phi", "phi3"]

NOT_ATTENTION_OR_FFN = {"pooler", "embeddings_project",
                        "embedding_hidden_mapping_in"}
"""Linear layers of a backbone that are neither attention nor FFN: left alone by design."""

R0 = 3


def _linears(model: nn.Module) -> dict[str, nn.Module]:
    """Every linear layer of the backbone, without ours: the LM head and task heads are
    outside ``base_model`` (or, for T5, the output embeddings)."""
    base = model.base_model
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    inside = {id(m) for m in base.modules()}
    return {p: m for p, m in model.named_modules()
            if isinstance(m, nn.Linear | Conv1D) and id(m) in inside and m is not head}


def _shape(m: nn.Module) -> tuple[int, int]:
    """(d_in, d_out), read the way each class documents it."""
    return (m.nx, m.nf) if isinstance(m, Conv1D) else (m.in_features, m.out_features)


def test_every_family_of_the_issue_has_targets_and_adapter_sites() -> None:
    assert set(ISSUE_FAMILIES) <= set(DEFAULT_TARGETS)
    assert set(ISSUE_FAMILIES) <= set(ADAPTER_SITES)
    assert set(ISSUE_FAMILIES) == set(FAMILIES)  # and the tests below build each of them


@pytest.mark.parametrize("kind", ISSUE_FAMILIES)
def test_defaults_are_every_attention_and_ffn_linear(kind: str) -> None:
    model = tiny_model(kind)
    linears = _linears(model)
    expected = [p for p in linears if not NOT_ATTENTION_OR_FFN & set(p.split("."))]
    assert resolve_targets(model, None) == expected
    handle = apply_method(model, run_config("adalora", adalora={"init_rank": R0}), None)
    # AdaLoRA at r0: P (d_out, r0), lam (r0,), Q (r0, d_in) per matrix
    assert handle.n_matrices == len(expected)
    assert handle.adapter_params == sum(R0 * (sum(_shape(linears[p])) + 1) for p in expected)
    if model.get_output_embeddings() is not None:
        assert type(model.get_output_embeddings()) is nn.Linear  # the LM head is not adapted


def _by_hand(kind: str, r0: int) -> tuple[int, int]:
    """(matrices, AdaLoRA parameters at r0) from the config sizes alone."""
    h, f, L = HIDDEN, FFN, LAYERS
    def m(d_in, d_out):  # one matrix: r0 (d_in + d_out + 1)
        return r0 * (d_in + d_out + 1)
    if kind == "llama":  # q, k, v (2 kv heads x 8 = 16), o, gate, up, down
        kv = 2 * (h // 4)
        per = m(h, h) + 2 * m(h, kv) + m(h, h) + 2 * m(h, f) + m(f, h)
        return 7 * L, L * per
    if kind == "gpt2":  # c_attn (h -> 3h), attn.c_proj, c_fc, mlp.c_proj: all Conv1D
        return 4 * L, L * (m(h, 3 * h) + m(h, h) + m(h, f) + m(f, h))
    if kind == "t5":  # inner 4 heads x d_kv 6 = 24; decoder adds cross-attention
        attn = 3 * m(h, 24) + m(24, h)
        ffn = m(h, f) + m(f, h)
        return 6 * L + 10 * L, L * (attn + ffn) + L * (2 * attn + ffn)
    if kind == "distilbert":  # q, k, v, out, lin1, lin2
        return 6 * L, L * (4 * m(h, h) + m(h, f) + m(f, h))
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["llama", "gpt2", "t5", "distilbert"])
def test_adalora_count_at_r0_matches_the_hand_count(kind: str) -> None:
    handle = apply_method(tiny_model(kind), run_config("adalora", adalora={"init_rank": R0}),
                          None)
    assert (handle.n_matrices, handle.adapter_params) == _by_hand(kind, R0)


def test_llama_targets_by_name() -> None:
    paths = resolve_targets(tiny_model("llama"), None)
    per_layer = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                 "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
    assert paths == [f"model.layers.{i}.{n}" for i in range(LAYERS) for n in per_layer]


@pytest.mark.parametrize("kind", ISSUE_FAMILIES)
def test_adapter_sites_one_attention_and_one_ffn_output_per_block(kind: str) -> None:
    model = tiny_model(kind)
    houlsby = adapter_sites(model, attention=True)
    pfeiffer = adapter_sites(model, attention=False)
    # blocks with an FFN: every layer (ALBERT shares one layer across depth)
    blocks = 1 if kind == "albert" else 2 * LAYERS if kind in ENCODER_DECODERS else LAYERS
    assert len(pfeiffer) == blocks and len(houlsby) == 2 * blocks
    assert set(pfeiffer) < set(houlsby) <= set(resolve_targets(model, None))
    attention = set(houlsby) - set(pfeiffer)
    assert not any(re.search(r"(encoder_attn|EncDecAttention)", p) for p in attention)
    # an FFN output maps the FFN width back to the model width; an attention output ends
    # in the model width too (from the heads' width, which differs in T5)
    linears = _linears(model)
    assert {_shape(linears[p]) for p in pfeiffer} == {(FFN, HIDDEN)}
    assert {_shape(linears[p])[1] for p in attention} == {HIDDEN}
    assert all("att" in p.lower() for p in attention)


def _bloom() -> nn.Module:
    config = AutoConfig.for_model("bloom", hidden_size=HIDDEN, n_layer=1, n_head=4,
                                  vocab_size=64)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def test_unknown_type_lists_its_linear_modules_and_the_fix() -> None:
    with pytest.raises(ConfigError) as info:
        apply_method(_bloom(), run_config("lora"), None)
    message = str(info.value)
    assert "\n" not in message
    assert message == (
        "no default target modules for model type bloom; its linear modules are "
        "query_key_value, dense, dense_h_to_4h, dense_4h_to_h; set "
        "method.target_modules=[query_key_value,dense,dense_h_to_4h,dense_4h_to_h] "
        "(names match the end of a module path)")
    handle = apply_method(_bloom(), run_config(
        "lora", method={"target_modules": ["query_key_value", "dense_4h_to_h"]}), None)
    assert handle.n_matrices == 2


def test_adapters_on_an_unknown_type_say_what_to_use_instead() -> None:
    with pytest.raises(ConfigError, match=r"no adapter placement known for model type 'bloom'; "
                                          r"use method.name=adalora or lora"):
        apply_method(_bloom(), run_config("houlsby"), None)
