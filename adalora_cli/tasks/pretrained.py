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
from huggingface_hub.utils import GatedRepoError, HFValidationError
from packaging.version import Version

from ..config import ConfigError
from ..errors import first_line
from . import gguf

DTYPE_KEYWORD = "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"
"""transformers 4.56 renamed ``torch_dtype`` to ``dtype``; older releases know only the old name."""


LOAD_ERRORS = (OSError, HFValidationError)
"""What loading a model raises when it cannot: a missing folder, a hub id that is unknown,
unreachable or malformed, a gated repo (an OSError caused by huggingface_hub's
GatedRepoError). :func:`load_failed` says which in one line."""


def load_failed(name: str, err: BaseException) -> ConfigError:
    """The one error for a model that did not load, whichever task family or loader met
    it: a gated repo (Llama, Gemma, Mistral) says how to get access, anything else where to
    point ``model.name_or_path``."""
    if _gated(err):
        return ConfigError(
            f"could not load model {name!r}: it is a gated repo ({first_line(err)}); "
            f"accept its licence on https://huggingface.co/{name}, then log in with "
            "`hf auth login` or set HF_TOKEN to a token of that account")
    return ConfigError(f"could not load model {name!r} ({first_line(err)}); set "
                       "model.name_or_path to a local folder or check the network")


def _gated(err: BaseException | None) -> bool:
    """Whether ``err`` or an error it was raised from is the hub's gated-repo refusal
    (transformers wraps it in an OSError, sometimes twice)."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, GatedRepoError):
            return True
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return False


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
