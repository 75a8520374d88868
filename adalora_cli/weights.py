"""Saving trained weights and loading a finished run back into a model.

Parameter-efficient runs save only what was trained (adapter + task head) as
``adapter_model.safetensors``; masked AdaLoRA singular values are saved as the zeros
they are, so the rank pattern travels with the weights. ``full`` saves the whole model
with ``save_pretrained``. ``load_run`` rebuilds the model from ``config.yaml`` and loads
the weights back, which is all a later evaluation or resume needs.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from .config import RunConfig, load_config
from .engine.build import load_model, resolve_resources, seed_everything
from .methods import apply_method
from .methods.base import MethodHandle
from .rundir import CONFIG, FULL_MODEL, WEIGHTS
from .tasks import get_task

ALLOCATOR_STATE = "allocator_state.pt"


def trained_state(model: nn.Module, handle: MethodHandle) -> dict[str, torch.Tensor]:
    """Trainable tensors by their parameter name in ``model`` (no duplicates)."""
    wanted = {id(p) for p in handle.trainable}
    state, seen = {}, set()
    for name, p in model.named_parameters():
        if id(p) in wanted and id(p) not in seen:
            seen.add(id(p))
            state[name] = p.detach().to("cpu").contiguous()
    return state


def save_weights(model: nn.Module, handle: MethodHandle, cfg: RunConfig, out: Path,
                 tokenizer: Any = None) -> dict[str, Any]:
    """Write the weights into the run directory; returns what was written for the summary."""
    written: dict[str, Any] = {}
    if cfg.method.name == "full":
        model.save_pretrained(out / FULL_MODEL, safe_serialization=True)
        if tokenizer is not None:  # so model/ loads on its own, like any checkpoint
            tokenizer.save_pretrained(out / FULL_MODEL)
        written["model_dir"] = FULL_MODEL
    else:
        state = trained_state(model, handle)
        save_file(state, str(out / WEIGHTS), metadata={"method": cfg.method.name})
        written["file"] = WEIGHTS
        written["tensors"] = len(state)
    allocator = handle.allocator
    if allocator is not None:
        torch.save(allocator.state_dict(), out / ALLOCATOR_STATE)
        written["allocator_state"] = ALLOCATOR_STATE
    return written


def load_run(run_dir: str | Path, device: str = "cpu"):
    """Rebuild a finished run's model with its trained weights: ``(model, tokenizer, cfg)``."""
    run_dir = Path(run_dir)
    cfg = resolve_resources(load_config(run_dir / CONFIG))
    if cfg.method.name == "full":
        cfg = dataclasses.replace(
            cfg, model=dataclasses.replace(cfg.model, name_or_path=str(run_dir / FULL_MODEL)))
    # Weights a checkpoint lacks (e.g. BERT's pooler in a masked-LM checkpoint) are freshly
    # initialized and stay frozen, so they are not saved: replay the run's seed so that
    # the rebuilt model draws the same values.
    seed_everything(cfg.train.seed)
    task = get_task(cfg)
    model, tokenizer = load_model(task, cfg)
    if cfg.method.name != "full":
        apply_method(model, cfg, None)
        state = load_file(str(run_dir / WEIGHTS))
        missing = set(state) - {name for name, _ in model.named_parameters()}
        if missing:
            raise ValueError(f"{run_dir / WEIGHTS} holds tensors the rebuilt model lacks: "
                             f"{sorted(missing)[:3]}")
        model.load_state_dict(state, strict=False)
    return model.to(device), tokenizer, cfg
