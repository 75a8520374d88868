"""LoRA (Hu et al., 2022): ``h = W0 x + b + (alpha / r) B A dropout(x)`` (Eq. 2;
docs/maths.md#methods), and the two variants that keep its layer, each with its builder here:
rsLoRA (Kalajdzievski, 2023) is the same layer scaled by ``alpha / sqrt(r)``
(docs/maths.md#rslora; :func:`build_rslora`); LoRA+ (Hayou et al., 2024) is this layer with a
faster learning rate for ``B`` (docs/maths.md#loraplus; the optimizer groups of
:func:`loraplus_groups`, :func:`build_loraplus`). :func:`build_lora` builds LoRA and its
ablations, which borrow AdaLoRA's machinery (``adalora.py``'s :func:`low_rank`), and LoRA on
a finished AdaLoRA run's final ranks (``lora.rank_pattern``; AutoLoRA's recipe,
docs/maths.md#lora-on-adaloras-ranks; :func:`lora_on_ranks`).

``A`` starts Kaiming-uniform (the same rule ``nn.Linear`` uses for its weight) and ``B`` at
zero, so ``Delta W = 0`` at step 0. Doublet ``i`` is ``(B[:, i], A[i, :])``; prune-LoRA (Table
5) zeroes whole doublets with the rank allocator, and LoRA_regu (Table 6) applies the
orthogonal regularizer to ``(B, A)`` through :meth:`LoRALinear.factors`. The base may be a
GPT-2 ``Conv1D`` (weight stored as ``(d_in, d_out)``); ``A`` and ``B`` keep the shapes above.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import nn

from ..config import ConfigError, RunConfig
from ..rundir.layout import RANK_PATTERN
from ..rundir.ranks import RankSource, read_rank_source
from .adalora import OrthogonalRegularizer, low_rank
from .base import (
    LinearWrapper,
    MethodHandle,
    ParamGroup,
    head_parameters,
    linear_dims,
    optional_dropout,
)
from .building import Layers, fixed_rank, inject
from .inject import replace_linears, resolve_targets


class LoRALinear(LinearWrapper):
    """A frozen ``nn.Linear`` plus the low-rank update ``(alpha / r) B A``."""

    def __init__(self, base: nn.Module, r: int, alpha: float, dropout: float = 0.0,
                 rslora: bool = False):
        super().__init__(base)
        self.r, self.alpha, self.rslora, self.dropout_p = r, alpha, rslora, dropout
        # rsLoRA: alpha / sqrt(r) keeps the update's scale stable as r grows
        # (docs/maths.md#rslora); LoRA: alpha / r (Eq. 2).
        self.scaling = alpha / math.sqrt(r) if rslora else alpha / r
        self.dropout = optional_dropout(dropout)
        w = base.weight  # (d_out, d_in); (d_in, d_out) for a Conv1D
        d_out, d_in = linear_dims(base)
        kw = {"device": w.device, "dtype": torch.float32}  # trained: fp32 whatever the base
        self.A = nn.Parameter(torch.empty(r, d_in, **kw))  # (r, d_in)
        self.B = nn.Parameter(torch.zeros(d_out, r, **kw))  # (d_out, r)
        # fan_in = d_in, exactly as nn.Linear(d_in, r) would initialise its weight.
        nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.dropout(x) @ self.A.T  # (..., r)
        return self.base(x) + (z @ self.B.T) * self.scaling

    def delta_weight(self) -> torch.Tensor:
        """``Delta W = s B A`` (s = ``scaling``), shape ``(d_out, d_in)``."""
        return self.B @ self.A * self.scaling

    def adapter_parameters(self) -> Iterator[nn.Parameter]:
        yield from (self.A, self.B)

    def factors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(B, A)``, in the roles of ``(P, Q)`` for the orthogonal regularizer."""
        return self.B, self.A

    def triplet_factors(self) -> tuple[torch.Tensor, None, torch.Tensor]:
        """``(B, None, A)``: a doublet has no singular value."""
        return self.B, None, self.A

    def extra_repr(self) -> str:
        return f"r={self.r}, scaling={self.scaling:g}"


def build_lora(model: nn.Module, cfg: RunConfig, total_steps: int | None) -> MethodHandle:
    lo = cfg.lora
    if lo.rank_pattern is not None:
        return lora_on_ranks(model, cfg)
    return low_rank(model, cfg, total_steps, rank=lo.r, rank_key="lora.r", gamma=lo.gamma,
                    prune=lo.prune,
                    wrap=lambda lin: LoRALinear(lin, lo.r, lo.alpha, lo.dropout))


def lora_on_ranks(model: nn.Module, cfg: RunConfig) -> MethodHandle:
    """LoRA on a finished AdaLoRA run's final ranks (AutoLoRA's recipe;
    docs/maths.md#lora-on-adaloras-ranks): matrix m at rank r_m with scale alpha / r_m, as
    PEFT's ``rank_pattern`` scales it; a matrix AdaLoRA pruned whole gets no adapter. The
    parameters trained are sum_m r_m (d_in + d_out), AdaLoRA's final budget in parameters."""
    lo = cfg.lora
    source = read_rank_source(lo.rank_pattern)
    if lo.rank_pattern_sha256 not in (None, source.sha256):  # a resumed run's source moved on
        raise ConfigError(f"{source.path}/{RANK_PATTERN} has changed since this run started "
                          f"(sha256 {lo.rank_pattern_sha256[:12]} then, {source.sha256[:12]} "
                          "now); restore that run, or start a new one")
    paths = resolve_targets(model, cfg.method.target_modules)
    check_pattern_fits(model, cfg, paths, source)
    level = cfg.sweep.budget_level
    if level is not None and source.budget != level:
        raise ConfigError(f"lora.rank_pattern={lo.rank_pattern} kept b(T) = {source.budget} "
                          f"ranks, but this run is at budget level {level}; name the AdaLoRA "
                          f"run of budget {level}")
    layers: Layers = []
    for path in paths:  # the model's order, as every builder wraps
        r = source.pattern[path]
        if r > 0:
            layers += replace_linears(
                model, [path], lambda lin, r=r: LoRALinear(lin, r, lo.alpha, lo.dropout))
    if not layers:
        raise ConfigError(f"lora.rank_pattern={lo.rank_pattern} has rank 0 everywhere: there "
                          "is nothing to train; name a run that kept some ranks")
    regularizer = (OrthogonalRegularizer([m for _, m in layers], cfg.adalora.orth_reg)
                   if lo.gamma > 0 else None)
    handle = fixed_rank(model, cfg, layers, reg_weight=lo.gamma, regularizer=regularizer,
                        rank_pattern={path: source.pattern[path] for path in paths},
                        # the source by its absolute path, so a resume finds it from anywhere
                        settled={"lora.rank_pattern": str(source.path.resolve()),
                                 "lora.rank_pattern_sha256": source.sha256})
    # every matrix the pattern covers, pruned ones too, as AdaLoRA counts them: the mean
    # final rank b(T) / n is then AdaLoRA's own
    handle.n_matrices = len(paths)
    return handle


def check_pattern_fits(model: nn.Module, cfg: RunConfig, paths: list[str],
                       source: RankSource) -> None:
    """The pattern names exactly the matrices this config adapts in this model; refused in
    one line otherwise (a run of another model, or of other target modules)."""
    key = f"lora.rank_pattern={cfg.lora.rank_pattern}"
    modules = dict(model.named_modules())
    foreign = [p for p in source.pattern if p not in modules]
    if foreign:
        raise ConfigError(f"{key} holds ranks of matrices this model does not have (e.g. "
                          f"{foreign[0]!r}): it trained {source.model}; name an AdaLoRA run "
                          f"of {cfg.model.name_or_path}")
    if set(source.pattern) != set(paths):
        extra = sorted(set(paths) ^ set(source.pattern))
        raise ConfigError(f"{key} adapted {len(source.pattern)} matrices where "
                          f"method.target_modules adapts {len(paths)} here (e.g. {extra[0]!r} "
                          "is in one only); set method.target_modules as that run's config does")
    for path in paths:
        smallest = min(linear_dims(model.get_submodule(path)))
        if source.pattern[path] > smallest:
            raise ConfigError(f"{key} gives {path!r} rank {source.pattern[path]}, above its "
                              f"smallest dimension {smallest}; name an AdaLoRA run of this model")


def build_rslora(model: nn.Module, cfg: RunConfig, total_steps: int | None) -> MethodHandle:
    rs = cfg.rslora  # docs/maths.md#rslora: LoRA scaled by alpha / sqrt(r)
    layers = inject(model, cfg, rs.r, "rslora.r",
                    lambda lin: LoRALinear(lin, rs.r, rs.alpha, rs.dropout, rslora=True))
    return fixed_rank(model, cfg, layers)


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
    layers = inject(model, cfg, lp.r, "loraplus.r",
                    lambda lin: LoRALinear(lin, lp.r, lp.alpha, lp.dropout))
    head = head_parameters(model)
    return fixed_rank(model, cfg, layers, groups=loraplus_groups(layers, head, lp.lr_ratio))
