"""Tiny configs of every model family with default targets, built on the meta device.

Sizes are small and distinct (hidden 32, FFN 37, 4 heads; 2 key/value heads where the
family has grouped-query attention), so a count that mixes up d_in and d_out cannot pass by
accident. Each family gets the task model a user would train: a classifier for encoders, a
seq2seq LM for encoder-decoders, a causal LM for decoders (so the LM head is present and
must stay unadapted)."""

from __future__ import annotations

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification,
)

HIDDEN, FFN, HEADS, KV_HEADS, LAYERS, VOCAB = 32, 37, 4, 2, 2, 64

_BERTISH = dict(hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                intermediate_size=FFN, vocab_size=VOCAB, max_position_embeddings=64)
_BARTISH = dict(d_model=HIDDEN, encoder_layers=LAYERS, decoder_layers=LAYERS,
                encoder_attention_heads=HEADS, decoder_attention_heads=HEADS,
                encoder_ffn_dim=FFN, decoder_ffn_dim=FFN, vocab_size=VOCAB,
                max_position_embeddings=64)
_T5ISH = dict(d_model=HIDDEN, d_kv=6, num_heads=HEADS, d_ff=FFN, num_layers=LAYERS,
              num_decoder_layers=LAYERS, vocab_size=VOCAB)
_LLAMAISH = dict(hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
                 num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=VOCAB,
                 max_position_embeddings=64, head_dim=HIDDEN // HEADS)

ENCODERS: dict[str, dict] = {
    "bert": _BERTISH, "roberta": _BERTISH, "xlm-roberta": _BERTISH, "electra": {
        **_BERTISH, "embedding_size": 16},
    "deberta": _BERTISH, "deberta-v2": _BERTISH, "mpnet": _BERTISH,
    "albert": {**_BERTISH, "embedding_size": 16},
    "distilbert": dict(dim=HIDDEN, hidden_dim=FFN, n_layers=LAYERS, n_heads=HEADS,
                       vocab_size=VOCAB, max_position_embeddings=64),
}
ENCODER_DECODERS: dict[str, dict] = {
    "bart": _BARTISH, "mbart": _BARTISH, "pegasus": _BARTISH, "t5": _T5ISH,
    "mt5": {**_T5ISH, "feed_forward_proj": "gated-gelu"},
}
DECODERS: dict[str, dict] = {
    "gpt2": dict(n_embd=HIDDEN, n_inner=FFN, n_layer=LAYERS, n_head=HEADS, vocab_size=VOCAB,
                 n_positions=64, bos_token_id=0, eos_token_id=1),
    "gpt_neox": dict(hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
                     num_attention_heads=HEADS, vocab_size=VOCAB,
                     max_position_embeddings=64),
    "opt": dict(hidden_size=HIDDEN, ffn_dim=FFN, num_hidden_layers=LAYERS,
                num_attention_heads=HEADS, vocab_size=VOCAB, word_embed_proj_dim=HIDDEN,
                max_position_embeddings=64),
    "llama": _LLAMAISH, "mistral": _LLAMAISH, "qwen2": _LLAMAISH, "qwen3": _LLAMAISH,
    "gemma": _LLAMAISH, "gemma2": _LLAMAISH,
    "phi": dict(hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
                num_attention_heads=HEADS, vocab_size=VOCAB, max_position_embeddings=64),
    "phi3": dict(hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
                 num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=VOCAB,
                 max_position_embeddings=64, pad_token_id=0, bos_token_id=0,
                 eos_token_id=1),
}
FAMILIES = {**ENCODERS, **ENCODER_DECODERS, **DECODERS}


def tiny_model(kind: str, device: str = "meta") -> torch.nn.Module:
    """The family's task model at the tiny sizes above (shapes only on the meta device)."""
    config = AutoConfig.for_model(kind, **FAMILIES[kind])
    auto = (AutoModelForSequenceClassification if kind in ENCODERS else
            AutoModelForSeq2SeqLM if kind in ENCODER_DECODERS else AutoModelForCausalLM)
    with torch.device(device):
        return auto.from_config(config)
