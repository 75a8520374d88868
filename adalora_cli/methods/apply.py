"""Fine-tuning methods on a model: :func:`apply_method` and each method's builder.

:func:`apply_method` freezes the whole model, injects the method's modules (through the
builder its registry entry names), and makes exactly the method's parameters plus the task
head trainable (docs/maths.md#methods). Adapter parameters are collected through the
:class:`~adalora_cli.methods.base.AdapterModule` protocol, never by matching parameter names.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from ..config import ConfigError, RunConfig
from .adalora import SVDLinear, orthogonal_regularizer
from .adapters import HoulsbyAdapter, PfeifferAdapter
from .allocator import RankAllocator, check_schedule
from .base import MethodHandle, adapter_modules, count, head_parameters, linear_dims
from .bitfit import bias_parameters
from .inject import adapter_sites, replace_linears, resolve_targets
from .lora import LoRALinear
from .registry import method_spec

Layers = list[tuple[str, nn.Module]]


def _adapter_params(layers: Layers) -> list[nn.Parameter]:
    return [p for _, layer in layers for p in layer.adapter_parameters()]


def _check_rank(model: nn.Module, paths: list[str], rank: int, key: str) -> None:
    """A rank above min(d_in, d_out) adds nothing and, at sizes like r0 = 12,500, exhausts
    memory before the first step: refuse it before any factor is allocated."""
    smallest = min(min(linear_dims(model.get_submodule(p))) for p in paths)
    if rank > smallest:
        raise ConfigError(f"{key}={rank} exceeds the smallest adapted matrix dimension "
                          f"({smallest}); lower {key} (or the sweep's --budget)")


def _low_rank(model: nn.Module, cfg: RunConfig, total_steps: int | None, *, rank: int,
              rank_key: str, gamma: float, prune: bool,
              wrap: Callable[[nn.Module], nn.Module]) -> MethodHandle:
    """Shared by AdaLoRA and LoRA: inject, regularizer, and the allocator when pruning.

    Pruning (AdaLoRA, or prune-LoRA) takes its budget, schedule and score from
    ``cfg.adalora``; the regularizer form too (LoRA_regu uses the same Eq. 4)."""
    paths = resolve_targets(model, cfg.method.target_modules)
    _check_rank(model, paths, rank, rank_key)
    pruning = prune and total_steps is not None
    a = cfg.adalora.resolved(len(paths))  # b(T) for these n matrices
    if pruning:  # reject an impossible schedule before touching the model
        check_schedule(len(paths) * rank, a.budget, a.t_init, a.t_final, total_steps)
    layers = replace_linears(model, paths, wrap)
    modules = [layer for _, layer in layers]
    form = a.orth_reg
    regularizer = (lambda: orthogonal_regularizer(modules, form)) if gamma > 0 else None
    allocator = RankAllocator.from_config(layers, a, total_steps) if pruning else None
    return MethodHandle(
        name=cfg.method.name, adapter=_adapter_params(layers), head=head_parameters(model),
        n_matrices=len(layers), reg_weight=gamma, regularizer=regularizer,
        after_step=allocator.step if allocator else None,
        allocator=allocator, layers=layers,
    )


def build_adalora(model: nn.Module, cfg: RunConfig, total_steps: int | None) -> MethodHandle:
    a = cfg.adalora
    return _low_rank(model, cfg, total_steps, rank=a.init_rank, rank_key="adalora.init_rank",
                     gamma=a.gamma, prune=a.prune,
                     wrap=lambda lin: SVDLinear(lin, a.init_rank, a.alpha, a.dropout))


def build_lora(model: nn.Module, cfg: RunConfig, total_steps: int | None) -> MethodHandle:
    lo = cfg.lora
    return _low_rank(model, cfg, total_steps, rank=lo.r, rank_key="lora.r", gamma=lo.gamma,
                     prune=lo.prune,
                     wrap=lambda lin: LoRALinear(lin, lo.r, lo.alpha, lo.dropout))


def _bottleneck(model: nn.Module, cfg: RunConfig, kind: type[nn.Module], *,
                attention: bool) -> MethodHandle:
    ad = cfg.adapter
    sites = adapter_sites(model, attention=attention)
    layers = replace_linears(model, sites, lambda lin: kind(lin, ad.dim, ad.dropout))
    return MethodHandle(name=cfg.method.name, adapter=_adapter_params(layers),
                        head=head_parameters(model), layers=layers)


def build_houlsby(model: nn.Module, cfg: RunConfig, total_steps: int | None) -> MethodHandle:
    return _bottleneck(model, cfg, HoulsbyAdapter, attention=True)  # attention + FFN


def build_pfeiffer(model: nn.Module, cfg: RunConfig, total_steps: int | None) -> MethodHandle:
    return _bottleneck(model, cfg, PfeifferAdapter, attention=False)  # FFN only


def _without_head(params: list[nn.Parameter], head: list[nn.Parameter]) -> list[nn.Parameter]:
    head_ids = {id(p) for p in head}
    return [p for p in params if id(p) not in head_ids]


def build_none(model: nn.Module, cfg: RunConfig, total_steps: int | None) -> MethodHandle:
    """No method at all: nothing trains, the model is evaluated as loaded."""
    return MethodHandle(name="none", adapter=[], head=[])


def build_bitfit(model: nn.Module, cfg: RunConfig, total_steps: int | None) -> MethodHandle:
    head = head_parameters(model)
    return MethodHandle(name="bitfit", adapter=_without_head(bias_parameters(model), head),
                        head=head)


def build_full(model: nn.Module, cfg: RunConfig, total_steps: int | None) -> MethodHandle:
    head = head_parameters(model)
    return MethodHandle(name="full", adapter=_without_head(list(model.parameters()), head),
                        head=head)


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
        rows.append({
            "module": path,
            "kind": type(module).__name__,
            "adapter_params": count(list(module.adapter_parameters())),
            "trainable": sum(p.numel() for p in module.parameters() if p.requires_grad),
        })
    return rows
