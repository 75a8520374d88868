"""Warm-start a BART-shaped encoder-decoder from an encoder-only BERT checkpoint.

The summarization demo must run offline, and the best pretrained weights that install from
the package registry are a 6-layer BERT (MiniLM-L6-H384,
docs/maths.md#offline-demo-data); no pretrained
seq2seq model does. Following Rothe et al. (2020, "Leveraging Pre-trained Checkpoints for
Sequence Generation Tasks"), both the encoder and the decoder start from the BERT weights.
The result is built as a :class:`~transformers.BartForConditionalGeneration` rather than a
``EncoderDecoderModel`` because the two layer designs are the same computation:

* embeddings: word + position (+ BERT's token-type 0, folded into the position table)
  -> LayerNorm; BART's learned positions carry an offset of 2 rows, which stay unused;
* every layer is post-LayerNorm: attention -> add -> LN -> FFN (GELU) -> add -> LN, with
  q/k/v/output projections and two FFN matrices named q_proj ... fc2 in BART;
* the output layer is the (tied) word-embedding matrix, as BART's ``lm_head`` is.

So the encoder reproduces BERT's hidden states (up to LayerNorm epsilon, 1e-5 vs 1e-12)
and the decoder layers are BERT layers run causally. The one block BERT lacks, decoder
cross-attention, starts as a copy of the same layer's self-attention (and its LayerNorm):
a pretrained projection into the space the encoder writes, rather than random weights the
low-rank methods could only correct. The output layer's per-word bias starts at zero and is
the task head (see :func:`bart_from_bert`). Being a BART model, every method, default
target list (96 matrices for 6 + 6 layers: self- and cross-attention and both FFN
matrices) and heatmap row of the package applies unchanged. Special tokens: [CLS] starts
the decoder, [SEP] ends a summary, [PAD] pads.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoModel, BartConfig, BartForConditionalGeneration

from ..config import ConfigError
from .pretrained import from_pretrained, load_tokenizer

# BART attention projection -> BERT module under ``encoder.layer.<i>.``
_ATTENTION = {"q_proj": "attention.self.query", "k_proj": "attention.self.key",
              "v_proj": "attention.self.value", "out_proj": "attention.output.dense"}


def bart_config_from_bert(bert_config: Any, tokenizer: Any) -> BartConfig:
    """A BART config with BERT's sizes, activation, dropout and special tokens."""
    c = bert_config
    positions = getattr(c, "position_embedding_type", "absolute")  # absent in newer configs
    if positions != "absolute":
        raise ConfigError(f"warm-starting needs absolute position embeddings; this BERT uses "
                          f"{positions!r}: pick another checkpoint")
    start, end, pad = tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id
    if None in (start, end, pad):
        raise ConfigError("the BERT tokenizer lacks [CLS], [SEP] or [PAD]; pick a checkpoint "
                          "whose tokenizer has them")
    return BartConfig(
        vocab_size=c.vocab_size, d_model=c.hidden_size,
        max_position_embeddings=c.max_position_embeddings,
        encoder_layers=c.num_hidden_layers, decoder_layers=c.num_hidden_layers,
        encoder_attention_heads=c.num_attention_heads,
        decoder_attention_heads=c.num_attention_heads,
        encoder_ffn_dim=c.intermediate_size, decoder_ffn_dim=c.intermediate_size,
        activation_function=c.hidden_act, dropout=c.hidden_dropout_prob,
        attention_dropout=c.attention_probs_dropout_prob, activation_dropout=0.0,
        scale_embedding=False, tie_word_embeddings=True,
        pad_token_id=pad, bos_token_id=start, eos_token_id=end, decoder_start_token_id=start)


def _copy_linear(dst: torch.nn.Linear, src: dict[str, torch.Tensor], prefix: str) -> None:
    dst.weight.copy_(src[f"{prefix}.weight"])
    dst.bias.copy_(src[f"{prefix}.bias"])


def copy_bert_weights(model: BartForConditionalGeneration, state: dict[str, torch.Tensor]) -> None:
    """Fill ``model`` from a ``BertModel`` state dict (keys without the ``bert.`` prefix)."""
    with torch.no_grad():
        model.model.shared.weight.copy_(state["embeddings.word_embeddings.weight"])
        positions = (state["embeddings.position_embeddings.weight"]
                     + state["embeddings.token_type_embeddings.weight"][0])
        for stack in (model.model.encoder, model.model.decoder):
            offset = stack.embed_positions.offset
            stack.embed_positions.weight[offset:offset + len(positions)].copy_(positions)
            _copy_linear(stack.layernorm_embedding, state, "embeddings.LayerNorm")
            for i, layer in enumerate(stack.layers):
                bert = f"encoder.layer.{i}"
                blocks = [(layer.self_attn, layer.self_attn_layer_norm)]
                if hasattr(layer, "encoder_attn"):  # decoder: cross-attention from self-attention
                    blocks.append((layer.encoder_attn, layer.encoder_attn_layer_norm))
                for attention, norm in blocks:
                    for name, source in _ATTENTION.items():
                        _copy_linear(getattr(attention, name), state, f"{bert}.{source}")
                    _copy_linear(norm, state, f"{bert}.attention.output.LayerNorm")
                _copy_linear(layer.fc1, state, f"{bert}.intermediate.dense")
                _copy_linear(layer.fc2, state, f"{bert}.output.dense")
                _copy_linear(layer.final_layer_norm, state, f"{bert}.output.LayerNorm")


def bart_from_bert(path: str, dtype: torch.dtype = torch.float32
                   ) -> tuple[BartForConditionalGeneration, Any]:
    """A seq2seq model warm-started from the BERT checkpoint at ``path``, and its tokenizer;
    built in ``dtype`` (fp32 unless the run asks for a half-precision base)."""
    tokenizer = load_tokenizer(path)
    bert = from_pretrained(AutoModel, path, dtype)  # the bare encoder; heads are dropped
    if bert.config.model_type != "bert":
        raise ConfigError(f"{path} is a {bert.config.model_type} model; warm-starting supports "
                          "BERT checkpoints only")
    model = BartForConditionalGeneration(bart_config_from_bert(bert.config, tokenizer)).to(dtype)
    copy_bert_weights(model, bert.state_dict())
    # BERT's output layer has a per-word bias that an encoder-only checkpoint lacks; BART's
    # ``final_logits_bias`` (a fixed zero buffer there) takes its place as a trainable
    # parameter. It sits outside ``model.model``, so every method trains it as the task
    # head, the way GLUE trains a new classifier: it learns the word prior a decoder that
    # has never generated text is missing (the initial loss is near log(vocab size)).
    bias = model.final_logits_bias
    del model._buffers["final_logits_bias"]
    model.final_logits_bias = torch.nn.Parameter(torch.zeros_like(bias))
    model.config.warm_started_from = str(path)  # provenance, kept by save_pretrained
    return model, tokenizer
