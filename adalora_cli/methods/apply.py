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
from .adalora import OrthogonalRegularizer, SVDLinear
from .adapters import HoulsbyAdapter, PfeifferAdapter
from .allocator import RankAllocator, check_schedule
from .base import MethodHandle, ParamGroup, adapter_modules, count, head_parameters, linear_dims
from .bitfit import bias_parameters
from .dora import DoRALinear
from .growth import plan_growth
from .increlora import IncreLoRALinear, RankGrower, born_orthogonality
from .inject import adapter_sites, replace_linears, resolve_targets
from .lora import LoRALinear
from .pissa import PiSSALinear
from .registry import method_spec
from .sora import GateSparsifier, SoRALinear, gate_l1

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
    regularizer = OrthogonalRegularizer(modules, a.orth_reg) if gamma > 0 else None
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


def _inject(model: nn.Module, cfg: RunConfig, rank: int, rank_key: str,
            wrap: Callable[[nn.Module], nn.Module]) -> Layers:
    """Wrap the target linears of a fixed-rank method, refusing a rank that cannot fit."""
    paths = resolve_targets(model, cfg.method.target_modules)
    _check_rank(model, paths, rank, rank_key)
    return replace_linears(model, paths, wrap)


def _fixed_rank(model: nn.Module, cfg: RunConfig, layers: Layers, **extra) -> MethodHandle:
    return MethodHandle(name=cfg.method.name, adapter=_adapter_params(layers),
                        head=head_parameters(model), n_matrices=len(layers), layers=layers,
                        **extra)


def build_rslora(model: nn.Module, cfg: RunConfig, total_steps: int | None) -> MethodHandle:
    rs = cfg.rslora  # docs/maths.md#rslora: LoRA scaled by alpha / sqrt(r)
    layers = _inject(model, cfg, rs.r, "rslora.r",
                     lambda lin: LoRALinear(lin, rs.r, rs.alpha, rs.dropout, rslora=True))
    return _fixed_rank(model, cfg, layers)


def build_dora(model: nn.Module, cfg: RunConfig, total_steps: int | None) -> MethodHandle:
    do = cfg.dora  # docs/maths.md#dora: A, B and the magnitude m train
    layers = _inject(model, cfg, do.r, "dora.r",
                     lambda lin: DoRALinear(lin, do.r, do.alpha, do.dropout, do.rslora))
    return _fixed_rank(model, cfg, layers)


def build_pissa(model: nn.Module, cfg: RunConfig, total_steps: int | None) -> MethodHandle:
    pi = cfg.pissa  # docs/maths.md#pissa: alpha = r unless set (s = 1)
    alpha = float(pi.r) if pi.alpha is None else pi.alpha
    layers = _inject(model, cfg, pi.r, "pissa.r",
                     lambda lin: PiSSALinear(lin, pi.r, alpha, pi.dropout))
    kept = [p for _, layer in layers for p in (layer.A0, layer.B0)]
    return _fixed_rank(model, cfg, layers, kept=kept)


def loraplus_groups(layers: Layers, head: list[nn.Parameter], ratio: float
                    ) -> list[ParamGroup]:
    """LoRA+'s optimizer groups (docs/maths.md#loraplus): every ``A`` and the head's
    matrices at the learning rate; every ``B`` at ``ratio`` times it; the head's vectors
    (biases, LayerNorm) at ``ratio`` times it without weight decay, as PEFT's
    ``create_loraplus_optimizer`` and the authors' reference code place them."""
    a_params = [layer.A for _, layer in layers]
    b_params = [layer.B for _, layer in layers]
    return [ParamGroup(a_params + [p for p in head if p.ndim > 1]),
            ParamGroup(b_params, lr_scale=ratio),
            ParamGroup([p for p in head if p.ndim <= 1], lr_scale=ratio, weight_decay=False)]


def build_loraplus(model: nn.Module, cfg: RunConfig, total_steps: int | None) -> MethodHandle:
    lp = cfg.loraplus
    layers = _inject(model, cfg, lp.r, "loraplus.r",
                     lambda lin: LoRALinear(lin, lp.r, lp.alpha, lp.dropout))
    head = head_parameters(model)
    return _fixed_rank(model, cfg, layers, groups=loraplus_groups(layers, head, lp.lr_ratio))


def build_sora(model: nn.Module, cfg: RunConfig, total_steps: int | None) -> MethodHandle:
    so = cfg.sora  # docs/maths.md#sora
    layers = _inject(model, cfg, so.r_max, "sora.r_max",
                     lambda lin: SoRALinear(lin, so.r_max, so.alpha, so.dropout))
    modules = [layer for _, layer in layers]
    gates = [layer.gate for layer in modules]
    gate_ids = {id(g) for g in gates}
    head = head_parameters(model)
    rest = [p for p in [*_adapter_params(layers), *head] if id(p) not in gate_ids]
    # the gates have their own optimizer without weight decay in the authors' code
    groups = [ParamGroup(rest), ParamGroup(gates, weight_decay=False)]
    sparsifier = GateSparsifier(layers, so, total_steps) if total_steps is not None else None
    return _fixed_rank(model, cfg, layers, groups=groups, reg_weight=so.l1,
                       regularizer=(lambda: gate_l1(modules)) if so.l1 > 0 else None,
                       reg_name="gate_l1", allocator=sparsifier,
                       after_step=sparsifier.step if sparsifier else None)


def build_increlora(model: nn.Module, cfg: RunConfig, total_steps: int | None
                    ) -> MethodHandle:
    ic = cfg.increlora  # docs/maths.md#increlora
    paths = resolve_targets(model, cfg.method.target_modules)
    plan = plan_growth(cfg, len(paths), total_steps)  # an impossible plan fails here
    smallest = min(min(linear_dims(model.get_submodule(p))) for p in paths)
    if plan.capacity > smallest:
        raise ConfigError(
            f"IncreLoRA would need room for {plan.capacity} ranks in one matrix (it may be "
            f"chosen at each of {plan.rounds} growth events), more than the smallest adapted "
            f"dimension ({smallest}); raise increlora.top_h or increlora.add_rank")
    reserve = plan.add_rank if plan.reserve else 0
    layers = replace_linears(model, paths, lambda lin: IncreLoRALinear(
        lin, plan.capacity, ic.init_rank, reserve, ic.alpha, ic.dropout))
    modules = [layer for _, layer in layers]
    # counted before any growth: a resumed or reloaded run counts what a fresh one does
    start = sum(layer.counted_parameters() for layer in modules)
    grower = (RankGrower(layers, plan, ic.beta1, ic.beta2, cfg.train.seed)
              if total_steps is not None else None)
    return _fixed_rank(
        model, cfg, layers, reg_weight=ic.gamma,
        regularizer=(lambda: born_orthogonality(modules)) if ic.gamma > 0 else None,
        allocator=grower, after_step=grower.step if grower else None,
        kept=[p for layer in modules for p in (layer.born, layer.active)],
        adapter_count=start)


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
        counted = getattr(module, "counted_parameters", None)  # IncreLoRA: born triplets
        rows.append({
            "module": path,
            "kind": type(module).__name__,
            "adapter_params": counted() if counted else count(list(module.adapter_parameters())),
            "trainable": sum(p.numel() for p in module.parameters() if p.requires_grad),
        })
    return rows
