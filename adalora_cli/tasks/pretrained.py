"""Loading a pretrained checkpoint in the dtype the run asks for, not the one it was saved in.

Hub checkpoints are stored in whatever dtype their authors chose: ``microsoft/deberta-v3-base``,
``facebook/bart-large``, OPT and Pythia in fp16, Llama, Qwen and Mistral in bf16, GPT-2 in
fp32. transformers 5 loads a checkpoint in its stored dtype unless told otherwise
(``dtype="auto"`` became the default), so a run that does not ask would train an fp16 base
with fp16 heads and adapters, where AdamW's epsilon (1e-8) rounds to zero and the loss is NaN
within steps. Every task family loads through :func:`from_pretrained`, which always names
the dtype: fp32 unless ``model.base_dtype`` asks for a half-precision base
(docs/training.md#precision); the task head and every adapter parameter are made fp32 after
loading, whatever the base's dtype.

A GGUF file (:mod:`.gguf`) loads through the same three functions: the weights are
dequantized straight into that dtype, and the config and tokenizer come from the file.
"""

from __future__ import annotations

from typing import Any

import torch
import transformers
from packaging.version import Version

from . import gguf

DTYPE_KEYWORD = "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"
"""transformers 4.56 renamed ``torch_dtype`` to ``dtype``; older releases know only the old name."""


def from_pretrained(auto_class: Any, path: str, dtype: torch.dtype = torch.float32,
                    **kwargs: Any) -> Any:
    """``auto_class.from_pretrained(path, **kwargs)`` with the weights in ``dtype``; a
    ``.gguf`` path is dequantized into ``dtype``."""
    where, extra = gguf.split(path)
    if not extra:
        return auto_class.from_pretrained(where, **{DTYPE_KEYWORD: dtype}, **kwargs)
    with gguf.reading(path), gguf.progress_as_configured():
        return auto_class.from_pretrained(where, **{DTYPE_KEYWORD: dtype}, **extra,
                                          **gguf.model_kwargs(), **kwargs)


def _from_path(auto_class: Any, path: str, kwargs: dict[str, Any]) -> Any:
    """``auto_class.from_pretrained(path)``, with the GGUF file's arguments for a ``.gguf``
    path (read under :func:`gguf.reading`)."""
    where, extra = gguf.split(path)
    if not extra:
        return auto_class.from_pretrained(where, **kwargs)
    with gguf.reading(path):
        return auto_class.from_pretrained(where, **extra, **kwargs)


def load_config(path: str, **kwargs: Any) -> Any:
    """``AutoConfig.from_pretrained(path)``, from the file's metadata for a ``.gguf`` path."""
    from transformers import AutoConfig

    return _from_path(AutoConfig, path, kwargs)


def load_tokenizer(path: str, **kwargs: Any) -> Any:
    """``AutoTokenizer.from_pretrained(path)``, built from the file for a ``.gguf`` path."""
    from transformers import AutoTokenizer

    return _from_path(AutoTokenizer, path, kwargs)
