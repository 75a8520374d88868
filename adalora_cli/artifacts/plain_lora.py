"""``--format lora``: a low-rank run as a plain PEFT ``LoraConfig`` folder, for loaders that
know LoRA only (vLLM, SGLang, llama.cpp's converter) as well as for PEFT.

Each adapted matrix's update ``Delta W`` is written as ``lora_B @ lora_A`` with every scale
of the method folded into ``lora_B`` (:data:`FOLDS`): AdaLoRA's ``(alpha / r0) P diag(lam)
Q`` becomes ``B = (alpha / r0) P[:, k] * lam[k]``, ``A = Q[k]``, keeping only the triplets
``k`` whose ``lam`` is not zero (docs/maths.md#svd-adaptation). A rank that contributes
nothing (a zero ``lam`` or gate, a zero column) is dropped, so each module keeps its final
rank, written in ``rank_pattern``; a module left with rank 0 is left out of
``target_modules`` altogether (PEFT refuses ``r = 0``, and it computes nothing).

Why ``lora_alpha = r``: loaders disagree on which rank divides ``lora_alpha``. vLLM and SGLang
apply one ``lora_alpha / r`` (the config's ``r``) to every module and ignore
``rank_pattern``; PEFT divides each module's ``alpha_pattern`` entry by its ``rank_pattern``
entry. With the factors already holding ``Delta W``, the scale every loader must apply is
1, so ``r`` is the largest final rank (what vLLM's ``--max-lora-rank`` must reach),
``lora_alpha = r``, and ``alpha_pattern`` repeats ``rank_pattern``: 1 everywhere, in every
loader that reads either. llama.cpp divides its one alpha by each tensor's own rank instead,
so its converted adapter needs its alpha set to 0, which it reads as a scale of 1
(docs/using-a-run.md#serving-it-as-plain-lora).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..config import ConfigError, RunConfig
from ..engine.outputs import head_modules
from ..methods.adalora import SVDLinear
from ..methods.base import adapter_modules
from ..methods.dora import DoRALinear
from ..methods.eva import EVALinear
from ..methods.gora import GoRALinear
from ..methods.increlora import IncreLoRALinear
from ..methods.lora import LoRALinear
from ..methods.pissa import PiSSALinear
from ..methods.registry import METHODS
from ..methods.sora import SoRALinear
from ..rundir.summary import Summary
from .peft import PREFIX, base_config, check_base_rebuilds, fan_in_fan_out, save_adapter

Factors = tuple[torch.Tensor, torch.Tensor]
"""``(B (d_out, k), A (k, d_in))`` with ``B @ A = Delta W`` exactly, nn.Linear's layout."""

FOLDS: dict[type[nn.Module], Callable[[Any], Factors]] = {
    # (alpha / r0) P diag(lam) Q, Eq. 3
    SVDLinear: lambda m: (m.P * (m.lam * m.scaling), m.Q),
    # LoRA and LoRA+ (alpha / r) B A, rsLoRA (alpha / sqrt(r)) B A: the layer's scaling says
    LoRALinear: lambda m: (m.B * m.scaling, m.A),
    # GoRA: alpha / r with the mean rank r, whatever the module's own rank
    GoRALinear: lambda m: (m.B * m.scaling, m.A),
    # EVA: its layer's scaling (alpha / r, or alpha / r_m without adjust_scaling_factors);
    # a module its pass gave rank 0 has no column to keep and is left out
    EVALinear: lambda m: (m.B * m.scaling, m.A),
    # (alpha / r_max) B diag(g) A
    SoRALinear: lambda m: (m.B * (m.gate * m.scaling), m.A),
    # (alpha / rank) P diag(lam) Q, with the reserve triplets' small lam the forward uses too
    IncreLoRALinear: lambda m: (m.P * (m.lam * m.scaling()), m.Q),
    # s (B A - B0 A0) on the original W0: the rank-2r [B, -B0] [A; A0] (docs/maths.md#pissa)
    PiSSALinear: lambda m: (torch.cat([m.B, -m.B0], dim=1) * m.scaling,
                            torch.cat([m.A, m.A0], dim=0)),
}
"""Adapted-layer type (exactly: a DoRA layer is not a LoRA layer) -> its update as factors.
A type without an entry is refused, never written as something else."""

NOT_PLAIN = {DoRALinear: "DoRA divides W0 + s B A by its row norms and rescales them by a "
                         "learned magnitude, which is no low-rank update; use --format peft "
                         "(PEFT's use_dora) or --format merged"}


def check_lora_method(method: str | None) -> None:
    """A method whose training is no low-rank update of linear weights is refused in one
    line, before the run's model is loaded (DoRA is found by its layers, once loaded)."""
    spec = METHODS.get(method or "")
    if spec is not None and spec.targeted:
        return
    if spec is None or not spec.trains:
        why, fix = "it trains nothing", "export a trained run"
    elif spec.mergeable:
        why, fix = "it trains the model's own tensors, not low-rank factors", \
            "use --format merged"
    else:
        why, fix = ("its bottleneck adapters are a nonlinear path beside the layers, not a "
                    "low-rank update of their weights"), \
            "load the run with adalora_cli.artifacts.load.load_run"
    raise ConfigError(f"method {method!r} cannot be written as plain LoRA: {why}; {fix}")


@torch.no_grad()
def fold(layer: nn.Module) -> Factors:
    """The layer's ``Delta W`` as ``(B, A)`` in fp32, ranks that contribute nothing dropped."""
    kind = type(layer)
    if kind not in FOLDS:
        why = NOT_PLAIN.get(kind, "its update has no plain-LoRA form here; use --format merged")
        raise ConfigError(f"the run's {kind.__name__} layers cannot be written as plain "
                          f"LoRA: {why}")
    B, A = (t.detach().float() for t in FOLDS[kind](layer))
    keep = (B != 0).any(dim=0) & (A != 0).any(dim=1)  # (k,)
    return B[:, keep], A[keep]


def write_lora(run_dir: Path, model: nn.Module, tokenizer: Any, cfg: RunConfig,
               summary: Summary, out: Path,
               base: tuple[str, str | None] | None = None) -> dict[str, Any]:
    """Write the plain-LoRA ``adapter_config.json`` and ``adapter_model.safetensors`` (and a
    sequence classifier's ``base_config.json``) into ``out``; the answer is
    :func:`.peft.save_adapter`'s with ``ranks`` (every adapted matrix's final rank, 0 for
    those left out) and ``r``."""
    check_lora_method(cfg.method.name)
    check_base_rebuilds(cfg, model)
    layers = adapter_modules(model)
    factors = {path: fold(layer) for path, layer in layers}
    ranks = {path: B.shape[1] for path, (B, _) in factors.items()}
    kept = [(path, layer) for path, layer in layers if ranks[path] > 0]
    if not kept:
        raise ConfigError(f"every adapted matrix of the run has rank 0 ({len(layers)} "
                          "matrices): the adapter changes nothing, so there is no LoRA to "
                          "write; use --format merged for the run's model")
    r = max(ranks.values())
    heads = head_modules(model)
    config = base_config(cfg, model, summary, heads, [path for path, _ in kept],
                         fan_in_fan_out(kept), base)
    # PEFT takes the first pattern key that matches a module as a suffix: the longest
    # paths first, so one that ends another (x.y and w.x.y) never takes its place
    order = sorted((path for path, _ in kept), key=len, reverse=True)
    config.update({"peft_type": "LORA", "r": r, "lora_alpha": r,
                   "rank_pattern": {path: ranks[path] for path in order},
                   "alpha_pattern": {path: ranks[path] for path in order},
                   "lora_dropout": _dropout(kept[0][1]), "use_rslora": False,
                   "use_dora": False})
    tensors = {}
    for path, _ in kept:
        B, A = factors[path]
        tensors[f"{PREFIX}{path}.lora_A.weight"] = A  # (r_m, d_in)
        tensors[f"{PREFIX}{path}.lora_B.weight"] = B  # (d_out, r_m)
    info = save_adapter(out, model, layers, config, tensors, heads)
    return {**info, "ranks": ranks, "r": r}


def _dropout(layer: nn.Module) -> float:
    """The run's dropout on the adapter's input (for training on; loading ignores it)."""
    return float(getattr(layer.dropout, "p", 0.0))
