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
"""

from __future__ import annotations

from typing import Any

import torch
import transformers
from packaging.version import Version

DTYPE_KEYWORD = "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"
"""transformers 4.56 renamed ``torch_dtype`` to ``dtype``; older releases know only the old name."""


def from_pretrained(auto_class: Any, path: str, dtype: torch.dtype = torch.float32,
                    **kwargs: Any) -> Any:
    """``auto_class.from_pretrained(path, **kwargs)`` with the weights in ``dtype``."""
    return auto_class.from_pretrained(path, **{DTYPE_KEYWORD: dtype}, **kwargs)
