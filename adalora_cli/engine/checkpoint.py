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
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from ..rundir.layout import CHECKPOINTS
from . import faults

TENSORS = "trainable.safetensors"
STATE = "state.pt"
FORMAT = 1


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
