"""Tiny models and configs built inline for the method tests (no download, CPU seconds)."""

from __future__ import annotations

import torch
from transformers import AutoModelForSequenceClassification, BertConfig

from adalora_cli.config import RunConfig, from_dict

# The tiny BERT of these tests: every size is small and distinct, so a count that mixes up
# d_in and d_out (32 vs 37) cannot pass by accident.
HIDDEN, LAYERS, HEADS, FFN, VOCAB, LABELS = 32, 2, 4, 37, 100, 2


def tiny_bert(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = BertConfig(hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                        intermediate_size=FFN, vocab_size=VOCAB, num_labels=LABELS,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return AutoModelForSequenceClassification.from_config(config)


def tiny_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, VOCAB, (4, 9), generator=g),
            "labels": torch.tensor([0, 1, 1, 0])}


def run_config(name: str, **sections: dict) -> RunConfig:
    """A validated RunConfig for method ``name`` with some sections overridden."""
    method = {"name": name, **sections.pop("method", {})}
    return from_dict({"method": method, **sections})
