"""What the methods' builders share: wrap the target linears at a rank that fits them, and
hand the loop the wrapped layers' parameters plus the task head.

A builder is ``build_<name>(model, cfg, total_steps) -> MethodHandle``; it lives in its
method's module, beside the layer it wraps the model with, and the registry names it.
:func:`~adalora_cli.methods.apply.apply_method` freezes the model before calling it and
marks the handle's parameters trainable after. ``total_steps`` is T; None means a dry run
(no rank controller, no schedule check).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from ..config import ConfigError, RunConfig
from .base import MethodHandle, head_parameters, linear_dims
from .inject import replace_linears, resolve_targets

Layers = list[tuple[str, nn.Module]]


def adapter_params(layers: Layers) -> list[nn.Parameter]:
    return [p for _, layer in layers for p in layer.adapter_parameters()]


def check_rank(model: nn.Module, paths: list[str], rank: int, key: str) -> None:
    """A rank above min(d_in, d_out) adds nothing and, at sizes like r0 = 12,500, exhausts
    memory before the first step: refuse it before any factor is allocated."""
    smallest = min(min(linear_dims(model.get_submodule(p))) for p in paths)
    if rank > smallest:
        raise ConfigError(f"{key}={rank} exceeds the smallest adapted matrix dimension "
                          f"({smallest}); lower {key} (or the sweep's --budget)")


def inject(model: nn.Module, cfg: RunConfig, rank: int, rank_key: str,
           wrap: Callable[[nn.Module], nn.Module]) -> Layers:
    """Wrap the target linears of a fixed-rank method, refusing a rank that cannot fit."""
    paths = resolve_targets(model, cfg.method.target_modules)
    check_rank(model, paths, rank, rank_key)
    return replace_linears(model, paths, wrap)


def fixed_rank(model: nn.Module, cfg: RunConfig, layers: Layers, **extra) -> MethodHandle:
    """The handle of a method that wrapped ``layers``: their adapter parameters, the task
    head, and whatever else the method adds (``groups``, a regularizer, a controller)."""
    return MethodHandle(name=cfg.method.name, adapter=adapter_params(layers),
                        head=head_parameters(model), n_matrices=len(layers), layers=layers,
                        **extra)


def without_head(params: list[nn.Parameter], head: list[nn.Parameter]) -> list[nn.Parameter]:
    """``params`` less the task head's (counted apart, as the head of every method)."""
    head_ids = {id(p) for p in head}
    return [p for p in params if id(p) not in head_ids]
