"""Fine-tuning methods: build one on a model and hand the training loop a MethodHandle.

:mod:`.registry` names every method (torch-free) and its builder, which lives in the method's
own module beside its layer; :mod:`.apply` builds one through it. The names below are
imported on first use, so ``import adalora_cli.methods.registry`` (the report, the CLI) never
loads torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {"apply_method": "apply", "parameter_table": "apply", "MethodHandle": "base",
         "RankAllocator": "allocator"}

__all__ = ["MethodHandle", "RankAllocator", "apply_method", "parameter_table"]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
