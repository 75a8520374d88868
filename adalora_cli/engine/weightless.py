"""A model's shapes without its weights: every transformers ``from_pretrained`` inside
:func:`weightless_loading` builds from ``config.json`` alone, on the meta device.

Two users: the dry run (``dryrun.py``), which only counts parameters, and every process but
rank 0 of a sharded run (``sharding.py``), which receives its rows from rank 0 instead of
reading the weights itself.
"""

from __future__ import annotations

import contextlib

import torch

from ..tasks.pretrained import DTYPE_KEYWORD


@contextlib.contextmanager
def weightless_loading():
    """Inside: every transformers ``from_pretrained`` builds its model from ``config.json``
    alone, and everything is created on the meta device (shapes and dtypes, no storage), so
    a 7B-shaped model costs nothing; a folder without a tokenizer gives ``None``.

    A task builds its model the way it builds it for training (the right head, a warm
    start), so the loading is intercepted here rather than taught to every task family."""
    from transformers import AutoTokenizer, PretrainedConfig, PreTrainedModel

    real_model = PreTrainedModel.__dict__["from_pretrained"]
    real_tokenizer = AutoTokenizer.__dict__["from_pretrained"]

    def from_config_only(cls, name, *args, config=None, **kwargs):
        if not isinstance(config, PretrainedConfig):
            config, kwargs = cls.config_class.from_pretrained(
                config or name, return_unused_kwargs=True, **kwargs)
        dtype = kwargs.get("dtype") or kwargs.get("torch_dtype")
        # by the keyword this transformers knows (torch_dtype before 4.56)
        return cls._from_config(config, **({DTYPE_KEYWORD: dtype} if dtype else {}))

    def tokenizer_if_any(cls, *args, **kwargs):
        try:
            return real_tokenizer.__func__(cls, *args, **kwargs)
        except (OSError, ValueError):  # a config-only folder: nothing needs a tokenizer
            return None

    PreTrainedModel.from_pretrained = classmethod(from_config_only)
    AutoTokenizer.from_pretrained = classmethod(tokenizer_if_any)
    try:
        with torch.device("meta"):
            yield
    finally:
        PreTrainedModel.from_pretrained = real_model
        AutoTokenizer.from_pretrained = real_tokenizer
