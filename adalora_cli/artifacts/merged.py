"""``--format merged``: Delta W folded into the base weights, saved as a plain model folder.

Every low-rank layer (AdaLoRA's ``(alpha / r0) P diag(lam) Q``, LoRA's ``(alpha / r) B A``)
adds its ``delta_weight()`` to the frozen weight it wraps and is replaced by that ``nn.Linear``,
so the folder holds no code of ours and loads with ``AutoModelFor...from_pretrained``. A run on
a 4-bit base (``model.quantize=nf4``) merges into its base's weights dequantized, the values
it trained against, and is saved in full precision. BitFit
and full fine-tuning change the model's own tensors, so their model is already "merged".
Bottleneck adapters add a nonlinear path after a layer; there is no weight to fold them
into, so merging them is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..config import ConfigError, RunConfig
from ..engine.quantize import dequantize
from ..methods.base import LinearWrapper, adapter_modules
from ..methods.registry import METHODS
from ..rundir.summary import Summary

MERGEABLE = tuple(name for name, spec in METHODS.items() if spec.mergeable)


def check_merge_method(method: str | None) -> None:
    if method not in MERGEABLE:
        peft = "/".join(n for n, s in METHODS.items() if s.peft_type)
        raise ConfigError(f"method {method!r} cannot be merged: its bottleneck adapters are a "
                          f"nonlinear path with no weight to fold into; use --format peft for "
                          f"{peft}, or load the run with adalora_cli.artifacts.load.load_run")


@torch.no_grad()
def merge_into_base(model: nn.Module) -> int:
    """Fold every low-rank layer into its base linear, in place; returns how many."""
    merged = 0
    for path, layer in adapter_modules(model):
        if not (isinstance(layer, LinearWrapper) and hasattr(layer, "delta_weight")):
            raise ConfigError(f"{path} ({type(layer).__name__}) has no weight update to merge")
        base = layer.base
        dequantize(base)  # a 4-bit NF4 base: the values the run trained against, in full
        # (d_out, d_in), transposed for a GPT-2 Conv1D whose weight is (d_in, d_out)
        base.weight += layer.to_base_layout(layer.delta_weight()).to(base.weight.dtype)
        parent_path, _, name = path.rpartition(".")
        parent = model.get_submodule(parent_path) if parent_path else model
        setattr(parent, name, base)
        merged += 1
    return merged


def write_merged(run_dir: Path, model: nn.Module, tokenizer: Any, cfg: RunConfig,
                 summary: Summary, out: Path) -> dict[str, Any]:
    """Merge in place and ``save_pretrained`` the model and its tokenizer into ``out``."""
    n = merge_into_base(model)
    for module in model.modules():  # linears no adapter wrapped, on a 4-bit base
        if isinstance(module, nn.Linear):
            dequantize(module)
    for p in model.parameters():
        p.requires_grad_(True)  # a plain model again: nothing is frozen by us
    model.save_pretrained(out, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    size = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    return {"merged_matrices": n, "model_class": type(model).__name__, "bytes": size}
