"""A model's module tree from its ``config.json`` alone: what planning needs, no weights.

A sweep matches every method's size to a budget level through n, the number of matrices
AdaLoRA adapts (docs/maths.md; the paper's b(T) = n * rbar). n depends only on the
architecture, so the planner, ``sweep --status`` and a SLURM submission build the model on
PyTorch's ``meta`` device from its config: every module exists with its shapes, no tensor
has storage, and no weight file is opened. A login node without the model cache, or a
machine offline with only the config, can plan and submit; the jobs load the weights.

The head class is the one the task family builds (paths from the model root must match
``method.target_modules`` exactly as in training), and a BERT checkpoint under a
summarization task becomes the BART it is warm-started into.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from ..config import ConfigError, RunConfig
from ..methods.inject import resolve_targets
from ..tasks import TASKS
from ..tasks.pretrained import load_config

_HEADS = {
    "glue": "AutoModelForSequenceClassification",
    "rotten_tomatoes": "AutoModelForSequenceClassification",
    "bbc_topic": "AutoModelForSequenceClassification",
    "squad": "AutoModelForQuestionAnswering",
    "summarization": "AutoModelForSeq2SeqLM",
    "causal_lm": "AutoModelForCausalLM",
    "bbc_topic_chat": "AutoModelForCausalLM",
}
"""Task family module -> the transformers auto class its ``build_model`` loads."""


def read_model_config(path: str) -> Any:
    """The checkpoint's ``config.json`` (local folder, or the hub cache), or a GGUF file's
    metadata; nothing else."""
    try:
        return load_config(path)
    except ConfigError:  # said already (a GGUF file without the gguf extra)
        raise
    except (OSError, ValueError) as err:  # no folder, no config.json, not in the cache
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise ConfigError(f"could not read the config of model {path!r} ({first}); set "
                          "model.name_or_path to a folder holding config.json, or a hub id "
                          "whose config is cached") from None


def task_family(task_name: str) -> str:
    """The task family module (``glue``, ``squad``, ``summarization`` ...): with the model
    and the target modules, what decides the architecture and so n."""
    factory = TASKS.get(task_name)
    if factory is None:
        raise ConfigError(f"unknown task.name {task_name!r}; valid names: {', '.join(TASKS)}")
    return factory.module


def model_skeleton(cfg: RunConfig) -> nn.Module:
    """The task's model for ``cfg`` on the meta device (``cfg``'s paths already resolved)."""
    import transformers

    family = task_family(cfg.task.name)
    config = read_model_config(cfg.model.name_or_path)
    if family == "summarization" and config.model_type == "bert":
        from ..tasks.warm_start import bart_config_from_bert

        # The special-token ids only fill config fields; they shape no module, so no
        # tokenizer file is read for them.
        ids = SimpleNamespace(cls_token_id=0, sep_token_id=1, pad_token_id=2)
        config = bart_config_from_bert(config, ids)
    auto = getattr(transformers, _HEADS[family])
    with torch.device("meta"):
        return auto.from_config(config)


def count_adapted(cfg: RunConfig) -> int:
    """n: the matrices ``method.target_modules`` (or the model type's defaults) select, as
    :func:`~adalora_cli.methods.apply_method` would adapt them; no weights are read."""
    return len(resolve_targets(model_skeleton(cfg), cfg.method.target_modules))
