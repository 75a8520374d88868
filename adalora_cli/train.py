"""The one training loop: where a method, a task and a run directory meet.

Reads top to bottom: build the task's model, load data, compute T, attach the method
(which validates AdaLoRA's schedule against T before anything is written), then train
with AdamW and a linear warm-up/decay, evaluate, and write the run directory.

Order inside one optimizer step follows SPEC section 5 (the authors' code):
backward -> clip -> optimizer.step -> lr step -> method.after_step(t) (score + mask)
-> zero_grad. ``t`` counts optimizer steps from 1, after gradient accumulation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random
import resource
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from huggingface_hub.utils import HFValidationError
from torch.utils.data import DataLoader

from . import resources
from .config import ConfigError, RunConfig
from .methods import apply_method, parameter_table
from .methods.base import MethodHandle
from .progress import TrainProgress
from .rundir import HEATMAP, RANK_PATTERN, RunDir, default_run_dir
from .tasks import get_task
from .tracking import Trackers, check_trackers  # tracking (issue 12)
from .weights import save_weights


def resolve_resources(cfg: RunConfig) -> RunConfig:
    """Turn ``package:`` paths into real paths (the demo's bundled weights and data)."""
    task = cfg.task
    files = ({k: resources.resolve(v) for k, v in task.data_files.items()}
             if task.data_files else None)
    task = dataclasses.replace(
        task, data_files=files,
        data_dir=resources.resolve(task.data_dir) if task.data_dir else None)
    model = dataclasses.replace(cfg.model, name_or_path=resources.resolve(cfg.model.name_or_path))
    return dataclasses.replace(cfg, task=task, model=model)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"train.device={name} but CUDA is not available; use train.device=cpu")
    return device


def autocast_factory(precision: str, device: torch.device):
    """Mixed precision on CUDA only; returns (context factory, dtype or None)."""
    if device.type != "cuda" or precision == "fp32":
        return contextlib.nullcontext, None
    if precision == "auto":
        precision = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return (lambda: torch.autocast("cuda", dtype=dtype)), dtype


def total_steps(n_train: int, cfg: RunConfig) -> int:
    """T in optimizer steps (SPEC section 4)."""
    t = cfg.train
    if t.max_steps:
        return t.max_steps
    per_epoch = math.ceil(n_train / (t.batch_size * t.grad_accum))
    return max(1, math.ceil(per_epoch * t.epochs))


def linear_schedule(warmup: int, total: int):
    """lr multiplier at optimizer step ``step`` (0-based as LambdaLR counts)."""
    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total - step) / max(1, total - warmup))
    return factor


def load_model(task, cfg: RunConfig):
    """The task's pretrained model and tokenizer; a missing model is a one-line error."""
    try:
        return task.build_model()
    except (OSError, HFValidationError) as err:  # missing folder, unknown or unreachable hub id
        raise ConfigError(
            f"could not load model {cfg.model.name_or_path!r} ({first_line(err)}); "
            "set model.name_or_path to a local folder or check the network") from None


def first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


def dry_run(cfg: RunConfig) -> dict[str, Any]:
    """Build model and method, train nothing; the per-module table plus the totals."""
    cfg = resolve_resources(cfg)
    model, _ = load_model(get_task(cfg), cfg)
    handle = apply_method(model, cfg, None)
    table = parameter_table(model)
    info = {
        "adapter_params": handle.adapter_params,
        "head_params": handle.head_params,
        "n_matrices": handle.n_matrices,
        "trainable_params": sum(p.numel() for p in handle.trainable),
        "total_params": sum(p.numel() for p in model.parameters()),
        "method": cfg.method.name,
        "model": cfg.model.name_or_path,
    }
    return {"table": table, "info": info}


def _peak_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    # ru_maxrss is in KiB on Linux: the process's peak resident memory.
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def evaluate_all(task, model, data, cfg: RunConfig, device, autocast, step: int,
                 run: RunDir, progress: TrainProgress,
                 trackers: Trackers | None = None) -> dict[str, dict[str, float]]:
    results = {}
    for split, dataset in data.eval_splits.items():
        progress.note(f"evaluating {split}")
        metrics = task.evaluate(model, split, dataset, batch_size=cfg.train.eval_batch_size,
                                collate=data.collate, device=device, autocast=autocast)
        results[split] = {k: float(v) for k, v in metrics.items()}
        run.log({"step": step, "split": split, **results[split]})
        if trackers is not None:  # tracking (issue 12)
            trackers.log_eval(step, split, results[split])
    progress.note("")
    return results


def train(cfg: RunConfig, run_dir: str | Path | None = None, quiet: bool = False) -> Path:
    """Train, evaluate and write a run directory. Returns its path."""
    check_trackers(cfg)  # tracking (issue 12): a missing tracker package fails before anything
    resolved = resolve_resources(cfg)  # the run dir keeps the portable, unresolved form
    seed_everything(cfg.train.seed)
    task = get_task(resolved)
    model, tokenizer = load_model(task, resolved)
    data = task.load_data(tokenizer)
    steps = total_steps(len(data.train), cfg)
    handle = apply_method(model, resolved, steps)  # rejects an impossible schedule here

    run = RunDir.create(run_dir or default_run_dir(cfg), cfg)
    _raise_on_sigterm()
    trackers = None  # tracking (issue 12)
    try:
        trackers = Trackers.open(cfg, run.path, resumed=False, warn=warn)  # tracking
        summary = _train_loop(cfg, task, model, tokenizer, data, handle, steps, run, quiet,
                              trackers)
        trackers.log_summary(summary)  # tracking
    except BaseException as err:
        reason = "interrupted by the user" if isinstance(err, KeyboardInterrupt) else (
            f"{type(err).__name__}: {first_line(err)}")
        run.fail(reason)
        try:
            err.run_dir = run.path  # lets the CLI name the directory it marked failed
        except AttributeError:
            pass
        raise
    finally:
        if trackers is not None:  # tracking: FINISHED if log_summary ran, else FAILED
            trackers.close()
    run.finish(summary)
    return run.path


class Terminated(Exception):
    """The process got SIGTERM (a scheduler, `kill`, a sweep being stopped)."""


def _raise_on_sigterm() -> None:
    """Turn SIGTERM into an exception, so a killed run is marked failed, not left 'running'."""
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be installed from the main thread

    def handler(signum, frame):
        raise Terminated("terminated by SIGTERM")
    signal.signal(signal.SIGTERM, handler)


def _train_loop(cfg: RunConfig, task, model, tokenizer, data, handle: MethodHandle, steps: int,
                run: RunDir, quiet: bool, trackers: Trackers) -> dict[str, Any]:
    t_cfg = cfg.train
    device = pick_device(t_cfg.device)
    model.to(device)
    model.train()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    autocast, amp_dtype = autocast_factory(t_cfg.precision, device)
    # fp16 needs loss scaling; bf16 and fp32 do not.
    scaler = torch.amp.GradScaler("cuda", enabled=amp_dtype is torch.float16)

    params = handle.trainable
    optimizer = torch.optim.AdamW(params, lr=t_cfg.learning_rate, weight_decay=t_cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, linear_schedule(t_cfg.warmup_steps, steps))
    generator = torch.Generator().manual_seed(t_cfg.seed)
    loader = DataLoader(data.train, batch_size=t_cfg.batch_size, shuffle=True,
                        collate_fn=data.collate, generator=generator)
    if len(loader) == 0:
        raise ConfigError("the training split is empty; check task.data_files / task.data_dir")

    step, start = 0, time.perf_counter()
    results: dict[str, dict[str, float]] = {}
    with TrainProgress(total=steps, disable=quiet) as progress:
        while step < steps:
            micro, loss_sum = 0, 0.0
            for i, batch in enumerate(loader):
                batch = {k: v.to(device) for k, v in batch.items()}
                with autocast():
                    loss = model(**batch).loss
                reg = handle.regularizer() if handle.regularizer is not None else None
                total = loss + handle.reg_weight * reg if reg is not None else loss
                scaler.scale(total / t_cfg.grad_accum).backward()
                micro += 1
                loss_sum += float(loss.detach())
                last_of_epoch = i == len(loader) - 1
                if micro % t_cfg.grad_accum and not last_of_epoch:
                    continue
                step_loss = loss_sum / micro
                micro, loss_sum = 0, 0.0
                step += 1
                if scaler.is_enabled():
                    # Unscale always, not only to clip: the allocator's |w * grad| (Eq. 8)
                    # must see true gradients, not ones multiplied by a moving loss scale.
                    scaler.unscale_(optimizer)
                if t_cfg.max_grad_norm > 0:
                    torch.nn.utils.clip_grad_norm_(params, t_cfg.max_grad_norm)
                lr = optimizer.param_groups[0]["lr"]  # the rate this step used
                scaler.step(optimizer)
                scaler.update()
                scheduler.step()
                logs = handle.after_step(step) if handle.after_step is not None else {}
                optimizer.zero_grad(set_to_none=True)

                if "ranks" in logs:
                    run.log_ranks(step, logs["ranks"])
                    trackers.log_ranks(step, logs["ranks"])  # tracking (issue 12)
                row = {"step": step, "loss": round(step_loss, 6), "lr": lr}
                if "budget" in logs:
                    row["budget"] = int(logs["budget"])
                if reg is not None:
                    row["orth_reg"] = round(float(reg.detach()), 6)
                if step % t_cfg.log_every == 0 or step == steps:
                    run.log(row)
                    trackers.log_row(row)  # tracking (issue 12)
                progress.advance(row)
                if not math.isfinite(row["loss"]):
                    raise FloatingPointError(
                        f"loss became {row['loss']} at step {step}; lower train.learning_rate")
                if t_cfg.eval_every and step % t_cfg.eval_every == 0 and step < steps:
                    evaluate_all(task, model, data, cfg, device, autocast, step, run, progress,
                                 trackers)  # tracking: trackers
                if step >= steps:
                    break
        train_seconds = time.perf_counter() - start
        results = evaluate_all(task, model, data, cfg, device, autocast, step, run, progress,
                               trackers)  # tracking: trackers
        if hasattr(task, "save_predictions"):  # e.g. predictions.json for SQuAD
            task.save_predictions(run.path)

    # epochs actually run (fractional under max_steps): the report's time per epoch
    epochs = steps / math.ceil(len(loader) / t_cfg.grad_accum)
    summary = _finish_outputs(cfg, model, tokenizer, handle, run, steps, results, train_seconds,
                              device, epochs=epochs)
    summary["data"] = data.info  # split sizes and sources: what T was computed from
    return summary


def _finish_outputs(cfg, model, tokenizer, handle, run, steps, results, train_seconds, device,
                    epochs=None):
    summary: dict[str, Any] = {
        "task": cfg.task.name,
        "method": cfg.method.name,
        "model": cfg.model.name_or_path,
        "seed": cfg.train.seed,
        "adapter_params": handle.adapter_params,
        "head_params": handle.head_params,
        "n_matrices": handle.n_matrices,
        "total_steps": steps,
        "metrics": results,
        "train_seconds": round(train_seconds, 2),
        "peak_memory_bytes": _peak_memory(device),
        "device": str(device),
        "epochs": round(epochs, 4) if epochs is not None else None,
        "budget_level": cfg.sweep.budget_level,
    }
    allocator = handle.extras.get("allocator")
    if allocator is not None:
        pattern = allocator.rank_pattern()
        run.write_json(RANK_PATTERN, pattern)
        summary["final_adapter_params"] = allocator.final_adapter_params()
        summary["final_budget"] = sum(pattern.values())
        from .heatmap import plot_rank_heatmap
        plot_rank_heatmap(pattern, run.path / HEATMAP,
                          title=f"{cfg.task.name} {cfg.method.name}: final ranks "
                                f"(budget {sum(pattern.values())})")
    if cfg.train.save_weights:
        summary["weights"] = save_weights(model, handle, cfg, run.path, tokenizer)
    return summary


def warn(message: str) -> None:
    """A tracker problem: reported, never fatal (tracking, issue 12)."""
    print(f"warning: {message}", file=sys.stderr, flush=True)


def print_error(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
