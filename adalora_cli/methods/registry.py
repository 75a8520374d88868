"""Every fine-tuning method, once: the one table the rest of the package derives from.

Config checking, the sweep's budget matching, the report's names and row order, export
and the summary's size label all read :data:`METHODS`. Adding a method is its module, its
config section and one entry here (``tests/methods/test_registry.py`` ties the three).

This module imports no torch: the report and the CLI's fast paths read it, and the builder
is named as ``"module:function"`` under :mod:`adalora_cli.methods`, imported only when a
model is actually built.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from ..config import RESUMABLE_KEYS, ConfigError, RunConfig, digest, flatten

# --------------------------------------------------------------------------- budget matching

# docs/maths.md#budget-levels (paper Tables 7, 9, 11): AdaLoRA's r0 for the tabulated mean
# final rank rbar = b(T) / n. ceil(1.5 * rbar) reproduces 1 -> 2, 4 -> 6 and 8 -> 12, but gives 3
# for rbar = 2 where the paper used 4.
R0_TABLE = {1: 2, 2: 4, 4: 6, 8: 12}


def round_half_up(x: Fraction) -> int:
    """Nearest whole size, at least 1 (a non-integer rbar such as 8 / 12 on the smoke model)."""
    return max(1, math.floor(x + Fraction(1, 2)))


def init_rank_for(rbar: Fraction) -> int:
    """r0 at mean final rank rbar; rounds up so that b0 = n * r0 >= b(T) always holds."""
    if rbar.denominator == 1 and rbar.numerator in R0_TABLE:
        return R0_TABLE[rbar.numerator]
    return max(1, math.ceil(Fraction(3, 2) * rbar))


# --------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class MethodSpec:
    name: str
    """The value of ``method.name``."""
    title: str
    """What the paper's tables call it (the report's row names)."""
    section: str | None
    """The config section holding its hyperparameters (None: it has none)."""
    builder: str
    """``"module:function"`` under ``adalora_cli.methods`` that injects it into a model:
    ``function(model, cfg, total_steps) -> MethodHandle``."""
    size_keys: tuple[tuple[str, str], ...] = ()
    """(config key, short label) that make up its size in words, e.g. ``r=8``."""
    unmatched_size_keys: tuple[tuple[str, str], ...] = ()
    """Extra size words shown only for a run outside a sweep's budget level (AdaLoRA's
    b(T), which the level itself states otherwise)."""
    match: Callable[[int, Fraction], dict[str, int]] | None = None
    """Budget level b(T) and rbar = b(T) / n -> the config values that give this method the
    matching size (docs/maths.md#budget-levels); None: its size does not follow the budget."""
    own_size: Callable[[RunConfig], str | None] = lambda cfg: None
    """The size in words of a config that sizes the method otherwise than its size keys
    (LoRA on a finished AdaLoRA run's ranks: ``ranks=adalora``), None for one that does not.
    A budget level then writes none of its size keys (the level is checked at build)."""
    peft_type: str | None = None
    """PEFT's ``peft_type`` when ``--format peft`` can export it."""
    mergeable: bool = False
    """``--format merged`` can fold it into the base weights (it is linear in W, or it
    changes W itself)."""
    saves_whole_model: bool = False
    """Its run saves the whole model (``model/``) instead of adapter + head."""
    prunes: Callable[[RunConfig], bool] = lambda cfg: False
    """It allocates a budget b(T) with AdaLoRA's schedule (Eq. 12,
    docs/maths.md#budget-schedule)."""
    borrows: Callable[[RunConfig], tuple[str, ...]] = lambda cfg: ()
    """Other sections its training reads in this config (LoRA reads ``adalora`` when it
    prunes, for budget, schedule and score, or regularizes, for the form of Eq. 4)."""
    targeted: bool = False
    """It wraps the linear modules named by ``method.target_modules`` (the bottleneck
    adapters sit at fixed sites instead; BitFit and full touch the whole model)."""
    shardable: bool = True
    """``train.sharding=fsdp`` can run it. Today's baselines cannot yet: their optimizer
    groups (LoRA+, SoRA), kept tensors (PiSSA) and rank controllers (SoRA, IncreLoRA) are
    not re-pointed at the sharded parameters, and none has been compared sharded against
    one process."""
    pass_batches: str | None = None
    """The config key holding how many training batches its pass before training reads
    (adalora_cli/engine/calibration.py; its value None: up to one epoch); None: no pass.
    The build refuses more batches than the training data holds."""
    trains_base: bool = False
    """It trains the pretrained weights themselves (full fine-tuning, BitFit's biases), so
    the base cannot be frozen in 4 bits (``model.quantize=nf4`` is refused)."""
    trains: bool = True
    """False: its run takes no step (T = 0) and only evaluates the model as loaded (``none``,
    the base model's zero-shot score as a row beside the trained methods)."""

    @property
    def sized(self) -> bool:
        return self.match is not None

    def size_label(self, cfg: RunConfig, level: int | None) -> str:
        """The size in words, e.g. ``r0=4`` (``r0=4 b(T)=144`` without a budget level)."""
        own = self.own_size(cfg)
        if own is not None:
            return own
        keys = self.size_keys + (self.unmatched_size_keys if level is None else ())
        return " ".join(f"{label}={config_value(cfg, key)}" for key, label in keys)

    def size_overrides(self, budget: int, n: int) -> list[str]:
        """``key=value`` overrides putting this method at budget level ``budget`` over ``n``
        adapted matrices; [] for a method without a size."""
        if self.match is None:
            return []
        if budget < 1 or n < 1:
            raise ConfigError(f"budget {budget} over {n} adapted matrices: both must be >= 1")
        return [f"{k}={v}" for k, v in self.match(budget, Fraction(budget, n)).items()]

    def reads(self, cfg: RunConfig) -> set[str]:
        """The config sections (and method keys) its training depends on."""
        out = {self.section} if self.section else set()
        if self.targeted:
            out.add("method.target_modules")
        return out | set(self.borrows(cfg))

    def build(self, model: Any, cfg: RunConfig, total_steps: int | None) -> Any:
        module, function = self.builder.split(":")
        return getattr(importlib.import_module(f"adalora_cli.methods.{module}"),
                       function)(model, cfg, total_steps)


PASS_NOTE = ("each matrix's rank is chosen in a pass before training, under the same b(T); "
             "counted here at the mean rank, the run's summary has what trained")
"""What a dry run says of the counts of a method with a pass (``pass_batches``)."""

METHODS: dict[str, MethodSpec] = {spec.name: spec for spec in (
    # The untrained base first, then the paper's row order (Table 1): full fine-tuning, then
    # the cheapest baselines first.
    MethodSpec("none", "Base model", None, "full:build_none", mergeable=True, trains=False),
    MethodSpec("full", "Full FT", None, "full:build_full", mergeable=True,
               saves_whole_model=True, trains_base=True),
    MethodSpec("bitfit", "BitFit", None, "bitfit:build_bitfit", mergeable=True,
               trains_base=True),
    MethodSpec("houlsby", "HAdapter", "adapter", "adapters:build_houlsby",
               size_keys=(("adapter.dim", "d"),),
               match=lambda b, rbar: {"adapter.dim": round_half_up(4 * rbar)}),
    MethodSpec("pfeiffer", "PAdapter", "adapter", "adapters:build_pfeiffer",
               size_keys=(("adapter.dim", "d"),),
               match=lambda b, rbar: {"adapter.dim": round_half_up(8 * rbar)}),
    MethodSpec("lora", "LoRA", "lora", "lora:build_lora", size_keys=(("lora.r", "r"),),
               match=lambda b, rbar: {"lora.r": round_half_up(rbar)}, peft_type="LORA",
               mergeable=True, prunes=lambda cfg: cfg.lora.prune, targeted=True,
               borrows=lambda cfg: ("adalora",) if cfg.lora.prune or cfg.lora.gamma > 0
               else (),
               # docs/maths.md#lora-on-adaloras-ranks: lora.r is not read then
               own_size=lambda cfg: "ranks=adalora" if cfg.lora.rank_pattern else None),
    # Today's baselines (docs/maths.md#todays-baselines): LoRA's variants at LoRA's rank,
    # SoRA from AdaLoRA's r0 down to the ranks its gates keep, IncreLoRA up to b(T).
    MethodSpec("rslora", "rsLoRA", "rslora", "lora:build_rslora",
               size_keys=(("rslora.r", "r"),),
               match=lambda b, rbar: {"rslora.r": round_half_up(rbar)}, peft_type="LORA",
               mergeable=True, targeted=True, shardable=False),
    MethodSpec("dora", "DoRA", "dora", "dora:build_dora", size_keys=(("dora.r", "r"),),
               match=lambda b, rbar: {"dora.r": round_half_up(rbar)}, peft_type="LORA",
               mergeable=True, targeted=True, shardable=False),
    MethodSpec("pissa", "PiSSA", "pissa", "pissa:build_pissa", size_keys=(("pissa.r", "r"),),
               match=lambda b, rbar: {"pissa.r": round_half_up(rbar)}, peft_type="LORA",
               mergeable=True, targeted=True, shardable=False),
    MethodSpec("loraplus", "LoRA+", "loraplus", "lora:build_loraplus",
               size_keys=(("loraplus.r", "r"),),
               match=lambda b, rbar: {"loraplus.r": round_half_up(rbar)}, peft_type="LORA",
               mergeable=True, targeted=True, shardable=False),
    # EVA: ranks and A from an SVD of the layers' inputs before training, then LoRA
    # (docs/maths.md#eva); its total rank is the budget level b(T).
    MethodSpec("eva", "EVA", "eva", "eva:build_eva", size_keys=(("eva.r", "r"),),
               match=lambda b, rbar: {"eva.r": round_half_up(rbar), "eva.budget": b},
               peft_type="LORA", mergeable=True, targeted=True, shardable=False,
               pass_batches="eva.n_batches"),
    # GoRA (docs/maths.md#gora): ranks from a gradient pass before training, under LoRA's
    # budget at the mean rank r (b(T) = r n ranks where every matrix has one shape).
    MethodSpec("gora", "GoRA", "gora", "gora:build_gora", size_keys=(("gora.r", "r"),),
               match=lambda b, rbar: {"gora.r": round_half_up(rbar)}, peft_type="LORA",
               mergeable=True, targeted=True, shardable=False, pass_batches="gora.n_batches"),
    MethodSpec("sora", "SoRA", "sora", "sora:build_sora", size_keys=(("sora.r_max", "r_max"),),
               match=lambda b, rbar: {"sora.r_max": init_rank_for(rbar)}, mergeable=True,
               targeted=True, shardable=False),
    MethodSpec("increlora", "IncreLoRA", "increlora", "increlora:build_increlora",
               size_keys=(("increlora.init_rank", "r_init"),),
               unmatched_size_keys=(("increlora.budget", "b(T)"),),
               match=lambda b, rbar: {"increlora.budget": b}, mergeable=True, targeted=True,
               shardable=False,
               borrows=lambda cfg: ("adalora",) if None in (
                   cfg.increlora.t_init, cfg.increlora.delta_t, cfg.increlora.t_final) else ()),
    MethodSpec("adalora", "AdaLoRA", "adalora", "adalora:build_adalora",
               size_keys=(("adalora.init_rank", "r0"),),
               unmatched_size_keys=(("adalora.budget", "b(T)"),),
               match=lambda b, rbar: {"adalora.budget": b,
                                      "adalora.init_rank": init_rank_for(rbar)},
               peft_type="ADALORA", mergeable=True, prunes=lambda cfg: cfg.adalora.prune,
               targeted=True),
)}
"""Method name -> its spec, in the paper's row order."""


def method_spec(name: str) -> MethodSpec:
    """The spec of ``method.name``; an unknown name is a one-line ConfigError."""
    spec = METHODS.get(name)
    if spec is None:
        raise ConfigError(f"unknown method.name {name!r}; choose from {', '.join(METHODS)}")
    return spec


def check_method(cfg: RunConfig) -> MethodSpec:
    return method_spec(cfg.method.name)


# --------------------------------------------------------------------------- run identity


def config_value(cfg: RunConfig, key: str) -> Any:
    """``cfg`` at a dotted key, e.g. ``config_value(cfg, "lora.r")``."""
    value: Any = cfg
    for part in key.split("."):
        value = getattr(value, part)
    return value


NOT_IDENTITY = ("train.seed", "sweep.", "train.save_weights", "train.log_every",
                "train.eval_at_start", "tune.", *RESUMABLE_KEYS)
"""Keys that never change a run's numbers: the seed (what seeds are averaged over), the
sweep's labels (the budget level is already in the sizes it set; the sweep's name says where
a run came from, not what it is) and where and how it runs (the keys ``--resume`` may
change: device, checkpoints, eval batch size, trackers), plus whether weights are saved and
how often a training row is logged, and whether the model is also scored before training;
a tune's trial labels (which study, which trial: a trial that runs to the end is an ordinary
run)."""


def comparable_config(cfg: RunConfig) -> dict[str, Any]:
    """The resolved config as ``{dotted key: value}``, keeping only what decides a run's
    numbers apart from its seed: runs with equal dicts are seeds of one experiment.

    Sections of other methods are dropped (a LoRA run does not read ``adapter.dim``)."""
    spec = METHODS.get(cfg.method.name)
    reads = spec.reads(cfg) if spec else None
    method_keys = {s.section for s in METHODS.values() if s.section} | {
        "method.target_modules"}
    out: dict[str, Any] = {}
    for key, value in flatten(cfg.to_dict()).items():
        if key.startswith(NOT_IDENTITY):
            continue
        owner = "method.target_modules" if key == "method.target_modules" else (
            key.split(".", 1)[0])
        if reads is not None and owner in method_keys and owner not in reads:
            continue
        out[key] = value
    if cfg.train.max_steps is not None:
        out.pop("train.epochs", None)  # T = max_steps: epochs is not read
    if out.get("lora.rank_pattern") is not None:
        out.pop("lora.r", None)  # not read: each matrix at its source run's rank
        level = cfg.sweep.budget_level
        if level is not None:
            # at a budget level each seed trains on the AdaLoRA run of its own seed at that
            # b(T) (the build checks the b(T)): the source varies as the seed does
            out["lora.rank_pattern"] = f"AdaLoRA's final ranks at b(T) = {level}"
            out.pop("lora.rank_pattern_sha256", None)
    return out


def config_digest(cfg: RunConfig) -> str:
    """sha256 of :func:`comparable_config`: equal digests are seeds of one experiment."""
    return digest(comparable_config(cfg))
