"""What a finished run leaves behind besides its logs: the trained weights and the facts an
export needs (base model, adapted modules, hyperparameters).

The engine writes these; ``artifacts/`` reads them back. Parameter-efficient runs save only
what was trained (adapter + task head) as ``adapter_model.safetensors``; masked AdaLoRA
singular values are saved as the zeros they are, so the rank pattern travels with the
weights. ``full`` saves the whole model with ``save_pretrained``.
"""

from __future__ import annotations

import dataclasses
import resource
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import save_file
from torch import nn

from ..config import RunConfig
from ..errors import writing
from ..methods.base import MethodHandle, head_parameters
from ..methods.registry import config_digest, method_spec
from ..rundir.layout import ALLOCATOR_STATE, FULL_MODEL, HEATMAP, RANK_PATTERN, WEIGHTS
from ..rundir.run import RunDir, follow_umask
from ..rundir.summary import ExportFacts, Summary
from .sharding import Final, model_class

if TYPE_CHECKING:
    from .build import Built


RESUME = "resume the run"
"""What to do about a full disk once there is room: the checkpoint at T is still there."""


def trained_state(model: nn.Module, handle: MethodHandle) -> dict[str, torch.Tensor]:
    """Trainable tensors, and the frozen ones the method keeps (PiSSA's principal factors,
    IncreLoRA's ranks), by their parameter name in ``model`` (no duplicates)."""
    wanted = {id(p) for p in [*handle.trainable, *handle.kept]}
    state, seen = {}, set()
    for name, p in model.named_parameters():
        if id(p) in wanted and id(p) not in seen:
            seen.add(id(p))
            state[name] = p.detach().to("cpu").contiguous()
    return state


def save_weights(model: nn.Module, handle: MethodHandle, cfg: RunConfig, out: Path,
                 tokenizer: Any = None, final: Final | None = None) -> dict[str, Any]:
    """Write the weights into the run directory; returns what was written for the summary.
    ``final``: a sharded run's trained tensors and allocator state, made whole."""
    written: dict[str, Any] = {}
    # a failed write (a full disk) names the file: the libraries' own errors do not
    if method_spec(cfg.method.name).saves_whole_model:
        with writing(out / FULL_MODEL, then=RESUME, library=True):
            model.save_pretrained(out / FULL_MODEL, safe_serialization=True)
            if tokenizer is not None:  # so model/ loads on its own, like any checkpoint
                tokenizer.save_pretrained(out / FULL_MODEL)
        follow_umask(out / FULL_MODEL)
        written["model_dir"] = FULL_MODEL
    else:
        state = final.weights if final is not None else trained_state(model, handle)
        with writing(out / WEIGHTS, then=RESUME, library=True):
            save_file(state, str(out / WEIGHTS), metadata={"method": cfg.method.name})
        follow_umask(out / WEIGHTS)  # safetensors writes 0600: a collaborator could not read
        written["file"] = WEIGHTS
        written["tensors"] = len(state)
    allocator = handle.allocator
    if allocator is not None:
        with writing(out / ALLOCATOR_STATE, then=RESUME, library=True):
            torch.save(final.allocator if final is not None else allocator.state_dict(),
                       out / ALLOCATOR_STATE)
        written["allocator_state"] = ALLOCATOR_STATE
    return written


def head_modules(model: nn.Module) -> list[str]:
    """Top-level modules holding the task head (outside ``model.base_model``)."""
    head = {id(p) for p in head_parameters(model)}
    return list(dict.fromkeys(name.split(".", 1)[0] for name, p in model.named_parameters()
                              if id(p) in head))


def export_facts(cfg: RunConfig, model: nn.Module, handle: MethodHandle,
                 base_gguf: dict[str, Any] | None = None) -> ExportFacts:
    """What an export needs to know about a run, recorded when it finishes; a GGUF base
    adds ``base_gguf`` (its file, sha256 and size), since its name alone does not say which
    weights it holds."""
    section = method_spec(cfg.method.name).section  # BitFit and full have none
    return ExportFacts(
        base_model=cfg.model.name_or_path,
        revision=getattr(getattr(model, "config", None), "_commit_hash", None),
        model_class=model_class(model).__name__,  # not FSDP's subclass of it
        model_type=getattr(getattr(model, "config", None), "model_type", None),
        target_modules=[path for path, _ in handle.layers],
        head_modules=head_modules(model),
        hyperparameters=dataclasses.asdict(getattr(cfg, section)) if section else {},
        base_gguf=base_gguf,
    )


def _peak_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    # ru_maxrss is in KiB on Linux: the process's peak resident memory.
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def write_outputs(built: Built, run: RunDir, results, train_seconds: float,
                  epochs: float, checkpoint_bytes: int | None,
                  final: Final | None = None, chosen_step: int | None = None) -> Summary:
    """Write a finished run's outputs (rank pattern, heatmap, weights); return its summary,
    for the run directory to write last. ``final``: a sharded run's weights, gathered whole
    (``sharding.gather_final``). ``chosen_step``: the earlier step whose weights and rank
    controller the model holds now (train.select=best), named in the heatmap's title."""
    cfg, handle = built.cfg, built.handle
    status = RunDir.read_status(run.path) or {}
    summary = Summary(
        task=cfg.task.name,
        method=cfg.method.name,
        model=cfg.model.name_or_path,
        seed=cfg.train.seed,
        adapter_params=handle.adapter_params,
        head_params=handle.head_params,
        n_matrices=handle.n_matrices,
        total_steps=built.steps,
        metrics=results,
        train_seconds=round(train_seconds, 2),
        peak_memory_bytes=_peak_memory(built.device),
        device=str(built.device),
        epochs=round(epochs, 4),
        budget_level=cfg.sweep.budget_level,
        attempts=int(status.get("attempt", 1)),
        size=method_spec(cfg.method.name).size_label(cfg, cfg.sweep.budget_level),
        config_digest=config_digest(cfg),
        report=built.task.report(results),
        # base model (a GGUF file with its hash), targets, hyperparameters
        export=export_facts(cfg, built.model, handle, built.base_gguf),
        data=built.data.info,  # split sizes and sources: what T was computed from
        checkpoint_bytes=checkpoint_bytes,
        trainable_params=handle.trainable_params,
    )
    allocator = handle.allocator
    if allocator is not None or handle.rank_pattern is not None:
        # a controller's final ranks, or the ranks the method was built with
        pattern = allocator.rank_pattern() if allocator else dict(handle.rank_pattern)
        run.write_json(RANK_PATTERN, pattern)
        summary.final_adapter_params = (allocator.final_adapter_params() if allocator
                                        else handle.adapter_params)
        summary.final_budget = sum(pattern.values())
        summary.final_mean_rank = round(summary.final_budget / handle.n_matrices, 4)
        from ..heatmap import plot_rank_heatmap  # matplotlib: only when a heatmap is drawn

        with writing(run.path / HEATMAP, then=RESUME, library=True):
            plot_rank_heatmap(pattern, run.path / HEATMAP,
                              title=f"{cfg.task.name} {cfg.method.name}: "
                                    + (f"ranks at step {chosen_step}" if chosen_step
                                       else "final ranks" if allocator
                                       else "ranks fixed before training")
                                    + f" (budget {sum(pattern.values())})")
    if cfg.train.save_weights:
        summary.weights = save_weights(built.model, handle, cfg, run.path, built.tokenizer,
                                       final)
    return summary
