"""Saving trained weights and loading a finished run back into a model.

Parameter-efficient runs save only what was trained (adapter + task head) as
``adapter_model.safetensors``; masked AdaLoRA singular values are saved as the zeros
they are, so the rank pattern travels with the weights. ``full`` saves the whole model
with ``save_pretrained``. ``load_run`` rebuilds the model from ``config.yaml`` and loads
the weights back, which is all a later evaluation or resume needs. Asked for a
half-precision base (``dtype``), it builds the model the way the run's build did: loaded
in that dtype, the trained parameters in fp32, every frozen one cast, so that a run that
trained on a bf16 base is scored again on the same bf16 weights; a run on a 4-bit base
(``model.quantize=nf4``) gets its base's linear weights in NF4 again.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from safetensors.torch import load_file

from ..config import ConfigError, RunConfig, load_config
from ..engine.build import (
    cast_frozen,
    load_model,
    resolve_resources,
    seed_everything,
    trained_in_fp32,
)
from ..engine.quantize import quantize_base
from ..errors import first_line
from ..methods import apply_method
from ..methods.registry import method_spec
from ..rundir.layout import CONFIG, FULL_MODEL, WEIGHTS
from ..tasks import get_task
from .gguf_base import check_unchanged


def check_weights(run_dir: Path, cfg: RunConfig) -> None:
    """Say why a run has no weights to load, before any model is built."""
    weights = run_dir / (FULL_MODEL if cfg.method.name == "full" else WEIGHTS)
    if weights.exists():
        return
    if not cfg.train.save_weights:
        raise ConfigError(f"run {run_dir} was trained with train.save_weights=false, so it "
                          "has no weights to load; train it again with "
                          "train.save_weights=true")
    raise ConfigError(f"run {run_dir} has no {weights.name} (deleted or moved?); restore it "
                      "or train the run again")


def load_run(run_dir: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32):
    """Rebuild a finished run's model with its trained weights: ``(model, tokenizer, cfg)``;
    its frozen base in ``dtype`` (the trained adapter and head stay fp32)."""
    run_dir = Path(run_dir)
    model, tokenizer, cfg = load_base(run_dir, dtype, trained=True)
    if not method_spec(cfg.method.name).saves_whole_model:
        attach_trained(model, cfg, run_dir, dtype)
    return model.to(device), tokenizer, cfg


def load_base(run_dir: str | Path, dtype: torch.dtype = torch.float32, trained: bool = False):
    """The run's pretrained model as its build loaded it, before any method was applied:
    ``(model, tokenizer, cfg)`` on the CPU. With ``trained``, a run that saves the whole
    model (full fine-tuning) gives its trained model instead, and a run without weights is
    refused first. :func:`attach_trained` makes the base the run's trained model."""
    run_dir = Path(run_dir)
    cfg = resolve_resources(load_config(run_dir / CONFIG))
    if trained:
        check_weights(run_dir, cfg)
    check_unchanged(run_dir, cfg.model.name_or_path)  # a GGUF base: the file trained on
    whole = trained and method_spec(cfg.method.name).saves_whole_model
    built = cfg
    if whole:
        built = dataclasses.replace(
            cfg, model=dataclasses.replace(cfg.model, name_or_path=str(run_dir / FULL_MODEL)))
    # Weights a checkpoint lacks (e.g. BERT's pooler in a masked-LM checkpoint) are freshly
    # initialized and stay frozen, so they are not saved: replay the run's seed so that
    # the rebuilt model draws the same values.
    seed_everything(cfg.train.seed)
    task = get_task(built)
    # a whole model trained every weight in fp32: there is no frozen base to cast
    model, tokenizer = load_model(task, built, torch.float32 if whole else dtype)
    return model, tokenizer, built


def attach_trained(model: torch.nn.Module, cfg: RunConfig, run_dir: str | Path,
                   dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """Apply the run's method to the base from :func:`load_base` (in place) and load its
    trained tensors: the run's model, for a method that saves only what it trained."""
    run_dir = Path(run_dir)
    check_weights(run_dir, cfg)
    if cfg.method.name == "lora" and cfg.lora.rank_pattern is not None:
        # its own rank_pattern.json holds the ranks it trained at (the recorded digest is
        # checked), so the AdaLoRA run it took them from may have moved or gone
        cfg = cfg.with_values({"lora.rank_pattern": str(run_dir)})
    handle = apply_method(model, cfg, None)
    trained_in_fp32(handle.trainable)  # a head made beside a bf16 base is made in bf16
    try:
        state = load_file(str(run_dir / WEIGHTS))
    except Exception as err:  # noqa: BLE001 - safetensors' own error type: a damaged file
        raise ConfigError(f"{run_dir / WEIGHTS} cannot be read ({first_line(err)}): it is "
                          "damaged or truncated; restore it, or train the run again"
                          ) from None
    if handle.calibration is not None:  # ranks its pass chose before training: as saved
        handle.calibration.restore({name: t.shape for name, t in state.items()})
    missing = set(state) - {name for name, _ in model.named_parameters()}
    if missing:
        raise ValueError(f"{run_dir / WEIGHTS} holds tensors the rebuilt model lacks: "
                         f"{sorted(missing)[:3]}")
    model.load_state_dict(state, strict=False)
    cast_frozen(model, dtype)  # as the build does after loading: e.g. BERT's pooler
    if cfg.model.quantize == "nf4":  # the 4-bit base the run trained on, as its build made it
        quantize_base(model)
    return model
