"""The whole model, with no layer added: full fine-tuning (the paper's "Full FT" row,
Table 1) trains every weight, and ``none`` (the "Base model" row) trains none and only
evaluates the model as loaded (docs/maths.md#methods).

Full fine-tuning's parameters are the backbone's as adapter plus the task head, each counted
once; its run saves the whole model (the registry's ``saves_whole_model``).
"""

from __future__ import annotations

from torch import nn

from ..config import RunConfig
from .base import MethodHandle, head_parameters
from .building import without_head


def build_full(model: nn.Module, cfg: RunConfig, total_steps: int | None) -> MethodHandle:
    head = head_parameters(model)
    return MethodHandle(name="full", adapter=without_head(list(model.parameters()), head),
                        head=head)


def build_none(model: nn.Module, cfg: RunConfig, total_steps: int | None) -> MethodHandle:
    """No method at all: nothing trains, the model is evaluated as loaded."""
    return MethodHandle(name="none", adapter=[], head=[])
