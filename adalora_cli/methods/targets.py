"""Default adaptation targets per model family (``config.model_type``).

:data:`DEFAULT_TARGETS` names "every attention and FFN matrix" of every layer, the paper's
setting ("all matrices", Sec. 4): the query, key, value and output projections of every
attention block (cross-attention included in encoder-decoders) and every FFN matrix (the
gate too, in gated FFNs). Embeddings, poolers, ALBERT's and ELECTRA's embedding projections
and the task / LM heads are not attention or FFN matrices and are never adapted. A target is
a suffix of the module path (see ``inject.py``), so one name covers every layer.

:data:`ADAPTER_SITES` says where the Houlsby / Pfeiffer bottleneck adapters attach: after the
attention block's output projection and after the FFN's output projection (Houlsby et al.,
2019). Families that fuse projections differently share a site table with their relatives.
"""

from __future__ import annotations

_BERT = ("query", "key", "value", "attention.output.dense", "intermediate.dense",
         "output.dense")
_BART = ("q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2")
_T5 = ("q", "k", "v", "o", "wi", "wo")
_LLAMA = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

DEFAULT_TARGETS: dict[str, tuple[str, ...]] = {
    # encoders
    "bert": _BERT,
    "roberta": _BERT,
    "xlm-roberta": _BERT,
    "electra": _BERT,
    "deberta": ("in_proj", "attention.output.dense", "intermediate.dense", "output.dense"),
    "deberta-v2": ("query_proj", "key_proj", "value_proj", "attention.output.dense",
                   "intermediate.dense", "output.dense"),
    "distilbert": ("q_lin", "k_lin", "v_lin", "out_lin", "lin1", "lin2"),
    "albert": ("query", "key", "value", "attention.dense", "ffn", "ffn_output"),
    "mpnet": ("attn.q", "attn.k", "attn.v", "attn.o", "intermediate.dense", "output.dense"),
    # encoder-decoders
    "bart": _BART,
    "mbart": _BART,
    "pegasus": _BART,
    "t5": _T5,
    "mt5": (*_T5, "wi_0", "wi_1"),  # gated FFN: wi_0 (gate) and wi_1 replace wi
    # decoders
    "gpt2": ("c_attn", "attn.c_proj", "c_fc", "mlp.c_proj"),  # Conv1D (weights transposed)
    "gpt_neox": ("query_key_value", "attention.dense", "dense_h_to_4h", "dense_4h_to_h"),
    "opt": _BART,
    "llama": _LLAMA,
    "mistral": _LLAMA,
    "qwen2": _LLAMA,
    "qwen3": _LLAMA,
    "gemma": _LLAMA,
    "gemma2": _LLAMA,
    "phi": ("q_proj", "k_proj", "v_proj", "self_attn.dense", "fc1", "fc2"),
    "phi3": ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"),
}
"""Every attention and FFN matrix of every layer ("all matrices" in the paper)."""

_BERT_SITES = ("attention.output.dense", "output.dense")
_BART_SITES = ("self_attn.out_proj", "fc2")
_LLAMA_SITES = ("self_attn.o_proj", "mlp.down_proj")

ADAPTER_SITES: dict[str, tuple[str, str]] = {
    "bert": _BERT_SITES,
    "roberta": _BERT_SITES,
    "xlm-roberta": _BERT_SITES,
    "electra": _BERT_SITES,
    "deberta": _BERT_SITES,
    "deberta-v2": _BERT_SITES,
    "distilbert": ("attention.out_lin", "ffn.lin2"),
    "albert": ("attention.dense", "ffn_output"),
    "mpnet": ("attention.attn.o", "output.dense"),
    "bart": _BART_SITES,
    "mbart": _BART_SITES,
    "pegasus": _BART_SITES,
    "t5": ("SelfAttention.o", "DenseReluDense.wo"),
    "mt5": ("SelfAttention.o", "DenseReluDense.wo"),
    "gpt2": ("attn.c_proj", "mlp.c_proj"),
    "gpt_neox": ("attention.dense", "mlp.dense_4h_to_h"),
    "opt": _BART_SITES,
    "llama": _LLAMA_SITES,
    "mistral": _LLAMA_SITES,
    "qwen2": _LLAMA_SITES,
    "qwen3": _LLAMA_SITES,
    "gemma": _LLAMA_SITES,
    "gemma2": _LLAMA_SITES,
    "phi": ("self_attn.dense", "mlp.fc2"),
    "phi3": _LLAMA_SITES,
}
"""(attention output projection, FFN output projection) per model type; the FFN site never
includes a module that is also the attention site (BERT's ``output.dense`` is both a suffix of
``attention.output.dense`` and the FFN output)."""
