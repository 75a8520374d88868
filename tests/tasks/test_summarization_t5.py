"""T5 in the summarization family: built as a seq2seq LM, every attention (self and cross)
and FFN matrix adapted, and the optional source prefix T5 checkpoints expect."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer, T5Config, T5ForConditionalGeneration

from adalora_cli.config import load_config
from adalora_cli.methods import apply_method
from adalora_cli.tasks import get_task
from tests.conftest import FIXTURES, ROOT

SMOKE = ROOT / "configs/smoke/summarization.yaml"


@pytest.fixture(scope="module")
def tiny_t5(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-t5")
    torch.manual_seed(0)
    T5ForConditionalGeneration(T5Config(
        vocab_size=512, d_model=32, d_kv=8, num_heads=4, d_ff=37, num_layers=2,
        num_decoder_layers=2, pad_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    ).save_pretrained(path)
    tok = AutoTokenizer.from_pretrained(FIXTURES / "tiny-bart")
    tok.save_pretrained(path)
    return path


def test_t5_is_adapted_in_every_attention_and_ffn_matrix(tiny_t5) -> None:
    cfg = load_config(SMOKE, [f"model.name_or_path={tiny_t5}", "adalora.init_rank=2"])
    model, _ = get_task(cfg).build_model()
    assert type(model).__name__ == "T5ForConditionalGeneration"
    handle = apply_method(model, cfg, None)
    # encoder layer: SelfAttention q k v o + wi wo; decoder adds EncDecAttention q k v o
    assert handle.n_matrices == 2 * 6 + 2 * 10
    # r0 2 x (d_in + d_out + 1): q k v 32 -> 32, o 32 -> 32, wi 32 -> 37, wo 37 -> 32
    attention, ffn = 4 * (32 + 32 + 1), 2 * (32 + 37 + 1)
    assert handle.adapter_params == 2 * (2 * (attention + ffn) + 2 * (2 * attention + ffn))
    assert handle.head == []  # the LM head (tied to the shared embeddings) stays frozen
    bias = model.encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight
    assert not bias.requires_grad


def test_source_prefix_goes_before_every_source(tiny_t5) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_t5)
    plain = get_task(load_config(SMOKE, [f"model.name_or_path={tiny_t5}"]))
    prefixed = get_task(load_config(SMOKE, [f"model.name_or_path={tiny_t5}",
                                            "task.source_prefix='summarize: '"]))
    a = plain.load_data(tok).eval_splits["validation"][0]
    b = prefixed.load_data(tok).eval_splits["validation"][0]
    source = plain.load_raw()["validation"][0]["document"]
    assert a["input_ids"] == tok(source, max_length=96, truncation=True)["input_ids"]
    assert b["input_ids"] == tok("summarize: " + source, max_length=96,
                                 truncation=True)["input_ids"]
    assert a["labels"] == b["labels"] and a["input_ids"] != b["input_ids"]
