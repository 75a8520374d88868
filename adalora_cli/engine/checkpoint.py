"""The training state to and from ``checkpoints/step-N/``, atomically.

A checkpoint holds everything the next optimizer step depends on: the trainable tensors
(adapter + head; every parameter for ``full``), the optimizer, lr scheduler and GradScaler,
the rank allocator (EMAs, mask, frozen flag), every RNG (python, numpy, torch CPU and CUDA),
the data order (the epoch's generator state at its start and the batches used since), the
step counter, the time trained so far, and how far ``metrics.jsonl`` and
``rank_history.jsonl`` had been written, so a resumed run first cuts off the rows that the
killed attempt wrote after this checkpoint.

Files are written into a hidden ``.partial-*`` folder, flushed to disk, and published by one
``rename``: a checkpoint appears whole or not at all, and a crash while writing leaves the
previous one as the latest.
"""

from __future__ import annotations

import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from ..rundir.layout import CHECKPOINTS
from . import faults

if TYPE_CHECKING:  # annotations only: reading a checkpoint needs no model code
    from .step import Stepper

TENSORS = "trainable.safetensors"
STATE = "state.pt"
FORMAT = 1


@dataclass
class Position:
    """Where the loop stands: what a checkpoint saves besides the objects' own state."""

    step: int = 0
    epoch: int = 0
    consumed: int = 0
    """Micro-batches of the current epoch already used."""
    epoch_start: torch.Tensor | None = None
    """The order generator's state when the current epoch began."""
    seconds: float = 0.0
    """Training time spent by earlier attempts."""
    seconds_now: float = 0.0
    """Training time up to the checkpoint being written."""
    saved_step: int = -1
    """The step of the newest checkpoint written (-1: none yet)."""
    checkpoint_bytes: int = 0
    """That checkpoint's size on disk, for the summary."""
    eval_pending: bool = False
    """The evaluation due at ``step`` was cut short by a stop signal: run it first."""


def state_of(stepper: Stepper, generator: torch.Generator, pos: Position,
             rng: dict[str, Any], streams: dict[str, int], eval_pending: bool = False
             ) -> dict[str, Any]:
    """Everything but the trainable tensors, as ``state.pt`` holds it. ``rng`` and
    ``streams`` are passed in because a checkpoint written when a stop signal cut an
    evaluation short saves the ones from before that evaluation (``eval_pending``)."""
    allocator = stepper.handle.allocator
    return {
        "optimizer": stepper.optimizer.state_dict(),
        "scheduler": stepper.scheduler.state_dict(),
        "scaler": stepper.scaler.state_dict(),
        "allocator": allocator.state_dict() if allocator is not None else None,
        "rng": rng,
        "data": {"epoch": pos.epoch, "epoch_start": pos.epoch_start, "consumed": pos.consumed,
                 "generator": generator.get_state()},
        "streams": streams,
        "eval_pending": eval_pending,
        "train_seconds": pos.seconds_now,
    }


def restore(state: dict[str, Any], stepper: Stepper) -> Position:
    """Put :func:`state_of`'s objects and RNGs back in place; returns the loop's position.
    The caller cuts the streams back to ``state["streams"]``."""
    stepper.optimizer.load_state_dict(state["optimizer"])
    stepper.scheduler.load_state_dict(state["scheduler"])
    stepper.scaler.load_state_dict(state["scaler"])
    if stepper.handle.allocator is not None:
        stepper.handle.allocator.load_state_dict(state["allocator"])
    set_rng_state(state["rng"])
    data = state["data"]
    return Position(step=state["step"], epoch=data["epoch"], consumed=data["consumed"],
                    epoch_start=data["epoch_start"], seconds=state["train_seconds"],
                    saved_step=state["step"], eval_pending=state.get("eval_pending", False))


def _step_dirs(run_path: Path) -> list[tuple[int, Path]]:
    root = run_path / CHECKPOINTS
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        name = child.name
        if name.startswith("step-") and name[5:].isdigit() and (child / STATE).is_file():
            found.append((int(name[5:]), child))
    return sorted(found)


def latest_checkpoint(run_path: Path) -> Path | None:
    found = _step_dirs(Path(run_path))
    return found[-1][1] if found else None


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def save_checkpoint(run_path: Path, step: int, tensors: dict[str, torch.Tensor],
                    state: dict[str, Any], keep: int) -> Path:
    """Publish ``checkpoints/step-N`` atomically, then keep only the newest ``keep``."""
    root = Path(run_path) / CHECKPOINTS
    root.mkdir(exist_ok=True)
    for stale in root.glob(".partial-*"):  # left by a process killed while writing
        shutil.rmtree(stale, ignore_errors=True)
    final = root / f"step-{step:07d}"
    tmp = root / f".partial-step-{step:07d}-{os.getpid()}"
    tmp.mkdir()
    try:
        save_file(tensors, str(tmp / TENSORS))
        torch.save({"format": FORMAT, "step": step, **state}, tmp / STATE)
        faults.hit("checkpoint", step)
        for name in (TENSORS, STATE):
            _fsync_file(tmp / name)
        if final.exists():  # the same step saved again (e.g. at the end): replace it
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for _, old in _step_dirs(Path(run_path))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors = load_file(str(path / TENSORS))
    # Our own file, written by save_checkpoint: it holds numpy's RNG state, which the
    # weights-only unpickler refuses.
    state = torch.load(path / STATE, map_location="cpu", weights_only=False)
    if state.get("format") != FORMAT:
        raise ValueError(f"{path} has checkpoint format {state.get('format')}, "
                         f"this version reads {FORMAT}")
    return tensors, state


def remove_all(run_path: Path) -> None:
    shutil.rmtree(Path(run_path) / CHECKPOINTS, ignore_errors=True)
