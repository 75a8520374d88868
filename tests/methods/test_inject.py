"""Where methods attach, and the paper's parameter counts on full-size configs (meta device)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import AutoModelForSequenceClassification, BartConfig, DebertaV2Config

from adalora_cli.config import ConfigError
from adalora_cli.methods import apply_method
from adalora_cli.methods.adalora import SVDLinear
from adalora_cli.methods.inject import adapter_sites, resolve_targets
from adalora_cli.methods.lora import LoRALinear
from tests.methods._tiny import LAYERS, run_config, tiny_bert


def _deberta_v3_base() -> nn.Module:
    config = DebertaV2Config(
        hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
        vocab_size=128100, relative_attention=True, position_buckets=256,
        pos_att_type=["p2c", "c2p"], max_relative_positions=-1, norm_rel_ebd="layer_norm",
        share_att_key=True, position_biased_input=False)
    with torch.device("meta"):  # shapes only: nothing is allocated or downloaded
        return AutoModelForSequenceClassification.from_config(config)


def _bart_large() -> nn.Module:
    config = BartConfig(d_model=1024, encoder_layers=12, decoder_layers=12,
                        encoder_ffn_dim=4096, decoder_ffn_dim=4096, encoder_attention_heads=16,
                        decoder_attention_heads=16, vocab_size=50265)
    with torch.device("meta"):
        return AutoModelForSequenceClassification.from_config(config)


def test_lora_r8_on_deberta_v3_base_is_1_33m() -> None:
    handle = apply_method(_deberta_v3_base(), run_config("lora", lora={"r": 8}), None)
    assert handle.n_matrices == 72
    # Table 1: 12 layers x (4 x 8 (768 + 768) + 2 x 8 (768 + 3072)) = 1,327,104
    assert handle.adapter_params == 1_327_104
    assert all(p.device.type == "meta" for p in handle.adapter)


def test_adalora_on_deberta_counts_the_singular_values() -> None:
    handle = apply_method(_deberta_v3_base(),
                          run_config("adalora", adalora={"init_rank": 12}), None)
    # r0 (d_in + d_out + 1) per matrix: 12 x (4 x 12 x 1537 + 2 x 12 x 3841)
    assert handle.n_matrices == 72 and handle.adapter_params == 12 * (48 * 1537 + 24 * 3841)
    assert handle.allocator is None and handle.after_step is None  # dry run


def test_bart_large_has_192_matrices_and_the_head_is_not_adapted() -> None:
    model = _bart_large()
    handle = apply_method(model, run_config("lora", lora={"r": 8}), None)
    assert handle.n_matrices == 192
    # per r: encoder layer 4 x 2048 + 2 x 5120, decoder layer 8 x 2048 + 2 x 5120
    assert handle.adapter_params == 8 * 12 * (18_432 + 26_624)
    assert type(model.classification_head.out_proj) is nn.Linear  # head out_proj untouched


def test_bart_adapter_sites() -> None:
    model = _bart_large()
    houlsby = adapter_sites(model, attention=True)
    pfeiffer = adapter_sites(model, attention=False)
    assert len(houlsby) == 48 and len(pfeiffer) == 24
    assert all(p.endswith(".fc2") for p in pfeiffer)
    assert {p for p in houlsby if p.endswith("self_attn.out_proj")} == set(houlsby) - set(pfeiffer)
    assert not any("encoder_attn" in p for p in houlsby)


def test_bert_default_targets_skip_pooler_and_classifier() -> None:
    model = tiny_bert()
    paths = resolve_targets(model, None)
    per_layer = ["attention.self.query", "attention.self.key", "attention.self.value",
                 "attention.output.dense", "intermediate.dense", "output.dense"]
    assert paths == [f"bert.encoder.layer.{i}.{m}" for i in range(LAYERS) for m in per_layer]


def test_bert_adapter_sites_split_attention_and_ffn_outputs() -> None:
    model = tiny_bert()
    ffn = [f"bert.encoder.layer.{i}.output.dense" for i in range(LAYERS)]
    attn = [f"bert.encoder.layer.{i}.attention.output.dense" for i in range(LAYERS)]
    assert adapter_sites(model, attention=False) == ffn
    assert sorted(adapter_sites(model, attention=True)) == sorted(attn + ffn)


def test_target_override_and_in_place_replacement() -> None:
    model = tiny_bert()
    handle = apply_method(model, run_config(
        "adalora", method={"target_modules": ["query", "value"]}), None)
    assert handle.n_matrices == 2 * LAYERS
    layer0 = model.bert.encoder.layer[0].attention.self
    assert isinstance(layer0.query, SVDLinear) and isinstance(layer0.value, SVDLinear)
    assert type(layer0.key) is nn.Linear
    assert [path for path, _ in handle.layers][:2] == [
        "bert.encoder.layer.0.attention.self.query", "bert.encoder.layer.0.attention.self.value"]


def test_errors_name_the_problem() -> None:
    with pytest.raises(ConfigError, match=r"\['nothing_here'\]"):
        apply_method(tiny_bert(), run_config(
            "lora", method={"target_modules": ["nothing_here"]}), None)
    bare = nn.Sequential(nn.Linear(4, 4))
    with pytest.raises(ConfigError, match="no default target modules for model type Sequential"):
        apply_method(bare, run_config("lora"), None)
    with pytest.raises(ConfigError, match=r"lora.r=8 exceeds the smallest adapted matrix "
                                          r"dimension \(4\)"):
        apply_method(bare, run_config("lora", method={"target_modules": ["0"]}), None)
    handle = apply_method(bare, run_config("lora", method={"target_modules": ["0"]},
                                           lora={"r": 4}), None)
    assert isinstance(bare[0], LoRALinear) and handle.n_matrices == 1
