"""Fine-tuning methods on a model: :func:`apply_method`, the one entry point, and
:func:`parameter_table`.

:func:`apply_method` freezes the whole model, injects the method's modules through the
builder its registry entry names (``build_<name>`` in the method's own module, beside its
layer), and makes exactly the method's parameters plus the task head trainable
(docs/maths.md#methods). Adapter parameters are collected through the
:class:`~adalora_cli.methods.base.AdapterModule` protocol, never by matching parameter names.
"""

from __future__ import annotations

from torch import nn

from ..config import RunConfig
from .base import MethodHandle, adapter_modules, count
from .registry import method_spec


def apply_method(model: nn.Module, cfg: RunConfig, total_steps: int | None) -> MethodHandle:
    """Inject ``cfg.method`` into ``model`` in place and mark exactly its parameters trainable.

    ``total_steps`` is T; None means a dry run: everything is built, but no rank allocator
    and no schedule check.
    """
    spec = method_spec(cfg.method.name)  # an unknown name fails before the model changes
    for p in model.parameters():
        p.requires_grad_(False)
    handle = spec.build(model, cfg, total_steps)
    for p in handle.trainable:
        p.requires_grad_(True)
    return handle


def parameter_table(model: nn.Module) -> list[dict]:
    """One row per adapter module: path, class, adapter parameters, trainable parameters."""
    rows = []
    for path, module in adapter_modules(model):
        counted = getattr(module, "counted_parameters", None)  # IncreLoRA: born triplets
        rows.append({
            "module": path,
            "kind": type(module).__name__,
            "adapter_params": counted() if counted else count(list(module.adapter_parameters())),
            "trainable": sum(p.numel() for p in module.parameters() if p.requires_grad),
        })
    return rows
