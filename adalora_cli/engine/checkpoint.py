"""The training state to and from ``checkpoints/step-N/``, atomically.

A checkpoint holds everything the next optimizer step depends on: the trainable tensors
(adapter + head; every parameter for ``full``), the optimizer, lr scheduler and GradScaler,
the rank allocator (EMAs, mask, frozen flag), every RNG (python, numpy, torch CPU and CUDA)
of every process (each rank draws its own dropout masks) and so the number of processes,
the autocast precision that ran and the loss scaler's skipped steps, the data order (the epoch's
generator state at its start and the batches used since), the step counter, the time
trained so far, how far ``metrics.jsonl`` and ``rank_history.jsonl`` had been written (bytes
and rows), so a resumed run first cuts off the rows that the killed attempt wrote after
this checkpoint, and the config the run was made with and its digest, so a resume under an
edited config refuses instead of silently computing another run (see :func:`check_config`).

``state.pt`` holds tensors, numbers, strings and containers only, and is read back
weights-only (rundir/no_code.py): a checkpoint that came from elsewhere cannot run code.

Files are written into a hidden ``.partial-*`` folder, flushed to disk, and published by one
``rename``: a checkpoint appears whole or not at all, and a crash while writing leaves the
previous one as the latest.

A sharded run (``train.sharding=fsdp``) keeps its trained tensors and optimizer state in a
``sharded/`` folder instead, each process writing its own rows (``sharded_checkpoint.py``);
``state.pt`` says which kind a checkpoint is, and a resume under the other kind is refused
with what to do (:func:`check_sharding`).
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

from ..config import RESUMABLE_KEYS, ConfigError, RunConfig, digest, flatten
from ..errors import describe, first_line, writing
from ..rundir.layout import CHECKPOINT_SHARDED as SHARDED
from ..rundir.layout import CHECKPOINT_STATE as STATE
from ..rundir.layout import CHECKPOINT_TENSORS as TENSORS
from ..rundir.layout import CHECKPOINTS
from ..rundir.no_code import PlantedCode, load_tensors, read_dcp_metadata
from ..rundir.run import follow_umask, fsync_path, resume_command
from . import faults

if TYPE_CHECKING:  # annotations only: reading a checkpoint needs no model code
    from .step import Stepper

FORMAT = 3
"""3: numpy's random state as a tensor and numbers, so ``state.pt`` loads weights-only (2:
per-rank RNG states, the config and its digest, stream rows; numpy's state as an array)."""
READS = (2, 3)
"""The formats a resume reads: a format-2 ``state.pt`` is converted as it loads
(:func:`_from_format_2`), and the run's next checkpoint is written in format 3."""


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
             rngs: list[dict[str, Any]], streams: dict[str, Any], eval_pending: bool = False,
             sharded: bool = False) -> dict[str, Any]:
    """Everything but the trainable tensors and the config record, as ``state.pt`` holds
    it. ``rngs`` (one per rank: each draws its own dropout masks) and ``streams`` are passed
    in because a checkpoint written when a stop signal cut an evaluation short saves the
    ones from before that evaluation (``eval_pending``). ``sharded``: the optimizer state
    is saved with the sharded tensors, not here; every process must call this then (the
    allocator's state is gathered from all of them)."""
    allocator = stepper.handle.allocator
    return {
        "sharding": "fsdp" if sharded else "none",
        "optimizer": None if sharded else stepper.optimizer.state_dict(),
        "scheduler": stepper.scheduler.state_dict(),
        "scaler": stepper.scaler.state_dict(),
        "allocator": allocator.state_dict() if allocator is not None else None,
        "rng": rngs,
        "data": {"epoch": pos.epoch, "epoch_start": pos.epoch_start, "consumed": pos.consumed,
                 "generator": generator.get_state()},
        "streams": streams,
        "eval_pending": eval_pending,
        "train_seconds": pos.seconds_now,
        "world_size": len(rngs),
        "precision": stepper.precision,
        "skipped": {"total": stepper.skipped, "run": stepper.skip_run},
    }


KERNEL_KEYS = ("fused", "foreach", "capturable")
"""Optimizer settings that say how the update runs on this machine, not what it computes."""


def _kernels_of(optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> dict[str, Any]:
    """``saved`` with this optimizer's kernel choice (fused AdamW on CUDA, torch's default on
    the CPU, Stepper.build) in each parameter group. ``load_state_dict`` would otherwise
    bring back the choice of the machine that saved it: a CPU checkpoint resumed on a GPU
    would step unfused while the loss scaler expects the fused step's own overflow check
    (and fails under fp16), and a GPU one resumed on the CPU would run the fused CPU kernel."""
    groups = [{**group, **{k: now[k] for k in KERNEL_KEYS if k in now}}
              for group, now in zip(saved["param_groups"], optimizer.param_groups)]
    return {**saved, "param_groups": groups}


def restore(state: dict[str, Any], stepper: Stepper, rank: int = 0) -> Position:
    """Put :func:`state_of`'s objects and this rank's RNGs back in place; returns the loop's
    position. The caller cuts the streams back to ``state["streams"]``."""
    if state["optimizer"] is not None:  # None: restored with the sharded tensors
        stepper.optimizer.load_state_dict(_kernels_of(stepper.optimizer, state["optimizer"]))
    stepper.scheduler.load_state_dict(state["scheduler"])
    if state["scaler"]:  # empty when saved without loss scaling: a new scaler starts fresh
        stepper.scaler.load_state_dict(state["scaler"])
    skipped = state.get("skipped") or {}
    stepper.skipped, stepper.skip_run = skipped.get("total", 0), skipped.get("run", 0)
    if stepper.handle.allocator is not None:
        stepper.handle.allocator.load_state_dict(state["allocator"])
    set_rng_state(rank_rng(state["rng"], rank))
    data = state["data"]
    return Position(step=state["step"], epoch=data["epoch"], consumed=data["consumed"],
                    epoch_start=data["epoch_start"], seconds=state["train_seconds"],
                    saved_step=state["step"], eval_pending=state.get("eval_pending", False))


def _step_dirs(run_path: Path, complete: bool = True) -> list[tuple[int, Path]]:
    """``(step, folder)`` of the published checkpoints, oldest first; ``complete=False``
    also lists folders that lost their ``state.pt`` (deleted, or a damaged disk)."""
    root = run_path / CHECKPOINTS
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        name = child.name
        if (name.startswith("step-") and name[5:].isdigit()
                and (not complete or (child / STATE).is_file())):
            found.append((int(name[5:]), child))
    return sorted(found)


def latest_checkpoint(run_path: Path) -> Path | None:
    found = _step_dirs(Path(run_path))
    return found[-1][1] if found else None


def checkpoints(run_path: Path) -> list[Path]:
    """Every published checkpoint of a run, oldest first."""
    return [path for _, path in _step_dirs(Path(run_path))]


def newest_readable(run_path: Path, note=lambda text: None
                    ) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that loads, and its state; None when there is none at all.

    A checkpoint that does not load (a disk error, a file damaged after it was published)
    is skipped for the one before it, with a note naming both. If none loads the resume is
    refused: starting over silently would throw the run's progress away."""
    found = [path for _, path in _step_dirs(Path(run_path), complete=False)]
    bad: list[str] = []
    for path in reversed(found):
        if not (path / STATE).is_file():  # named, never silently passed over
            bad.append(f"{path}: no {STATE}")
            continue
        try:
            _, state = load_checkpoint(path)
        except PlantedCode:  # not damage but a file put there: refused, never passed over
            raise
        except Exception as err:  # any damage: the reader's own words say which
            bad.append(f"{path}: {describe(err)}")
            continue
        if bad:
            note(f"skipped unreadable checkpoint(s) {'; '.join(bad)}; resuming from "
                 f"{path.name}, the newest one that loads")
        return path, state
    if bad:
        raise ConfigError(f"no checkpoint of {run_path} can be read ({bad[0]}); delete "
                          f"{Path(run_path) / CHECKPOINTS} to start the run over")
    return None


# ------------------------------------------------------------------ the run's config
def flat_config(cfg: RunConfig | dict[str, Any]) -> dict[str, Any]:
    """{"train.learning_rate": 0.005, ...}: every leaf of the config under its dotted key
    (``task.data_files`` whole, as checkpoints have always recorded it)."""
    return flatten(cfg.to_dict() if isinstance(cfg, RunConfig) else cfg, leaves=("data_files",))


def may_change(key: str) -> bool:
    """Keys a resume may change: where and how the run is watched, saved and evaluated
    (``config.RESUMABLE_KEYS``), never what it computes (the schedule, the maths, the data)."""
    return key.startswith(RESUMABLE_KEYS) and not key.endswith(".")


def resume_digest(cfg: RunConfig | dict[str, Any]) -> str:
    """The digest of the config without the keys that :func:`may_change`: a resume must
    match it (recorded as the checkpoint's ``config_digest``)."""
    return digest({k: v for k, v in flat_config(cfg).items() if not may_change(k)})


def config_record(cfg: RunConfig) -> dict[str, Any]:
    """What a checkpoint keeps of the config: every value, and the digest of those that
    must not change."""
    return {"config": flat_config(cfg), "config_digest": resume_digest(cfg)}


_ABSENT = "(absent)"


def check_sharding(path: Path, state: dict[str, Any], cfg: RunConfig,
                   processes: int | None = None) -> None:
    """Refuse to resume a whole checkpoint sharded, or a sharded one whole or on one process
    (``processes``, where known): their files differ (a whole ``trainable.safetensors`` and
    ``state.pt``, or every process's rows). The refusal names the command that works."""
    saved, now = state.get("sharding", "none"), cfg.train.sharding
    run = path.parent.parent
    if saved == "fsdp" and (now != "fsdp" or (processes is not None and processes < 2)):
        n = max(2, saved_world_size(state))
        keep = [] if now == "fsdp" else ["train.sharding=fsdp"]
        raise ConfigError(f"{path.name} of {run} was written sharded (train.sharding=fsdp) by "
                          f"{n} processes and resumes only sharded, on 2 or more; resume it "
                          f"with {resume_command(run, n, keep)}")
    if saved != "fsdp" and now == "fsdp":
        raise ConfigError(f"{path.name} of {run} was written whole (train.sharding=none, one "
                          "process or DDP) and cannot resume sharded; resume it with "
                          "train.sharding=none, or start a new run with train.sharding=fsdp")


def check_config(path: Path, state: dict[str, Any], cfg: RunConfig
                 ) -> dict[str, list[Any]]:
    """Refuse to resume checkpoint ``path`` under a config that would compute another run.

    Returns the changes it allows ({key: [before, now]}), for the run directory to record;
    raises a one-line ConfigError naming every other changed key."""
    check_sharding(path, state, cfg)
    saved, now = state.get("config") or {}, flat_config(cfg)
    keys = sorted(set(saved) | set(now))
    defaults = flat_config(RunConfig())

    def differs(k: str) -> bool:
        before, after = saved.get(k, _ABSENT), now.get(k, _ABSENT)
        # a key added to the config since the checkpoint was written, unset (None) or at its
        # default, leaves the run what it was (a new key's default keeps the old behaviour,
        # e.g. task.format=auto): an upgrade must not strand a checkpoint
        return before != after and not (before == _ABSENT and after in (None, defaults.get(k)))

    changed = [k for k in keys if differs(k) and not may_change(k)]
    if state.get("config_digest") != resume_digest(cfg) and (changed or not saved):
        listed = ", ".join(f"{k} {saved.get(k, _ABSENT)!r} -> {now.get(k, _ABSENT)!r}"
                           for k in changed[:6]) or "keys this version cannot name"
        raise ConfigError(
            f"the config of {path.parent.parent} changed since {path.name} was saved "
            f"({listed}); a resumed run must compute the same run: put those values back "
            "in its config.yaml, or start a new run (a resume may change only "
            + ", ".join(k.rstrip(".") + ("*" if k.endswith(".") else "")
                        for k in RESUMABLE_KEYS) + ")")
    return {k: [saved.get(k), now.get(k)] for k in keys if differs(k)}


# ------------------------------------------------------------------ random number generators
def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": _numpy_state(np.random.get_state()),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def saved_world_size(state: dict[str, Any]) -> int:
    """How many processes wrote a checkpoint (older ones: one RNG state per process)."""
    return int(state.get("world_size") or len(state.get("rng") or [None]))


def machine_changes(state: dict[str, Any], world_size: int, precision: str
                    ) -> dict[str, list[Any]]:
    """What differs between the processes and autocast precision a checkpoint ran with and
    this resume's ({"processes": [2, 1], "precision": ["bf16", "fp16"]}); empty if nothing."""
    changes: dict[str, list[Any]] = {}
    if saved_world_size(state) != world_size:
        changes["processes"] = [saved_world_size(state), world_size]
    if state.get("precision", precision) != precision:
        changes["precision"] = [state["precision"], precision]
    return changes


def describe_machine_changes(changes: dict[str, list[Any]]) -> str:
    """One line on what a resume on other processes or another GPU restores exactly and what
    it cannot (docs/run-directory.md#resuming)."""
    parts = []
    if "processes" in changes:
        saved, now = changes["processes"]
        parts.append(
            f"resuming on {now} process{'es' if now > 1 else ''} a checkpoint written by "
            f"{saved}: the weights, optimizer, lr and budget schedules, rank allocator and data "
            "order carry on exactly, but each process's random stream (dropout) and the sum "
            "of gradients over processes cannot, so the run matches an uninterrupted one only "
            "up to those")
    if "precision" in changes:  # another GPU, or train.device changed
        saved, now = changes["precision"]
        tail = ", without its loss scaler" if saved == "fp16" else (
            ", with a fresh loss scaler" if now == "fp16" else "")
        said = {"fp32": "fp32", "bf16": "bf16 autocast", "fp16": "fp16 autocast"}
        parts.append(f"this device runs {said[now]} where the checkpoint ran {said[saved]}: "
                     f"the run goes on so{tail}")
    return "; ".join(parts)


def rank_rng(states: list[dict[str, Any]], rank: int) -> dict[str, Any]:
    """This rank's RNG state from a checkpoint's per-rank list. On as many processes as
    wrote it each rank gets its own back (exact resume); on another number the ranks
    reuse them in turn (the run goes on, but its dropout masks differ from an
    uninterrupted run's)."""
    return states[rank % len(states)]


def _numpy_state(state: tuple) -> dict[str, Any]:
    """numpy's legacy RNG state (``np.random.get_state()``: the generator's name, 624 uint32
    keys, position, Gaussian flag and cached value) as a tensor and plain numbers, which
    torch's weights-only unpickler reads (a numpy array it refuses)."""
    name, keys, pos, has_gauss, cached = state
    return {"name": str(name), "keys": torch.from_numpy(np.asarray(keys).astype(np.int64)),
            "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}


def _numpy_tuple(state: dict[str, Any]) -> tuple:
    return (state["name"], state["keys"].numpy().astype(np.uint32), state["pos"],
            state["has_gauss"], state["cached_gaussian"])


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(_numpy_tuple(state["numpy"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        _set_cuda_rng_states(state["cuda"])


def _set_cuda_rng_states(states: list[torch.Tensor]) -> None:
    """Each visible GPU's generator from the checkpoint's, device by device. A checkpoint
    keeps one state per GPU that was visible when it was written; resumed where fewer are
    visible, the devices that exist get theirs (a process trains on its own device, the
    first one of a single-process run) and the rest are dropped. (torch's
    ``set_rng_state_all`` indexes a device per saved state and fails there.)"""
    for index, saved in enumerate(states[:torch.cuda.device_count()]):
        torch.cuda.set_rng_state(saved, index)


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def save_checkpoint(run_path: Path, step: int, tensors: dict[str, torch.Tensor],
                    state: dict[str, Any], keep: int) -> Path:
    """Publish ``checkpoints/step-N`` atomically, then keep only the newest ``keep``."""
    def write(tmp: Path, final: Path) -> None:
        _write(tmp / TENSORS, final / TENSORS, lambda p: save_file(tensors, str(p)))
        write_state(tmp, final, step, state)

    return publish(run_path, step, begin(run_path, step), write, keep)


def begin(run_path: Path, step: int) -> Path:
    """A fresh hidden folder for checkpoint ``step`` (stale ones of killed writers go)."""
    root = Path(run_path) / CHECKPOINTS
    root.mkdir(exist_ok=True)
    for stale in root.glob(".partial-*"):  # left by a process killed while writing
        shutil.rmtree(stale, ignore_errors=True)
    tmp = root / f".partial-step-{step:07d}-{os.getpid()}"
    tmp.mkdir()
    return tmp


def write_state(tmp: Path, final: Path, step: int, state: dict[str, Any]) -> None:
    _write(tmp / STATE, final / STATE,
           lambda p: torch.save({"format": FORMAT, "step": step, **state}, p))


def publish(run_path: Path, step: int, tmp: Path, write, keep: int) -> Path:
    """``write(tmp, final)`` the rest of the files into ``tmp`` (:func:`begin`'s folder,
    maybe already holding the sharded files), flush everything, rename it to
    ``checkpoints/step-N`` and keep only the newest ``keep`` checkpoints."""
    root = Path(run_path) / CHECKPOINTS
    final = root / f"step-{step:07d}"
    try:
        write(tmp, final)
        faults.hit("checkpoint", step)
        for path in sorted(tmp.rglob("*")):
            if path.is_file():
                follow_umask(path)  # safetensors writes 0600: collaborators could not read
                _fsync_file(path)
        for folder in [p for p in tmp.rglob("*") if p.is_dir()]:
            fsync_path(folder)
        if final.exists():  # the same step saved again (e.g. at the end): replace it
            shutil.rmtree(final)
        os.rename(tmp, final)
        fsync_path(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for _, old in _step_dirs(Path(run_path))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _write(tmp: Path, final: Path, write) -> None:
    """``write(tmp)``, with a failure said as which file and why, with the OS's error
    number: torch's writer reports a full disk as ``[enforce fail at inline_container.cc]
    . unexpected pos``, safetensors as "(os error 28)" (errors.write_failed)."""
    with writing(final, then="resume the run", written_as=tmp, library=True):
        write(tmp)


def load_checkpoint(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The trained tensors and the state of a checkpoint; a file that does not read
    (truncated, damaged) is a ValueError naming it. A sharded one's tensors load only into a
    sharded model (``sharded_checkpoint.load``): here they are ``{}``, once their index has
    been read (a damaged one is unreadable here, as a damaged whole file is)."""
    state = read_state(path / STATE)
    if state.get("sharding", "none") == "fsdp":
        _read(path / SHARDED, read_dcp_metadata)
        return {}, state
    return _read(path / TENSORS, lambda f: load_file(str(f))), state


def read_state(file: Path) -> dict[str, Any]:
    """A checkpoint's ``state.pt``, weights-only (rundir/no_code.py): a planted pickle is
    refused (:class:`PlantedCode`) without running; a format-2 one is converted."""
    def load(f: Path) -> Any:
        try:
            return load_tensors(f)
        except PlantedCode:  # format 2 kept numpy's state as an array: allow just that
            return load_tensors(f, numpy_arrays=True)

    state = _read(file, load)
    if not isinstance(state, dict) or state.get("format") not in READS:
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"{file.parent} has checkpoint format {found}, this version reads "
                         f"{' and '.join(map(str, READS))}")
    return _from_format_2(state) if state["format"] == 2 else state


def _from_format_2(state: dict[str, Any]) -> dict[str, Any]:
    """A format-2 state as format 3: numpy's RNG state from its array to tensor and numbers."""
    rngs = [{**rng, "numpy": _numpy_state(rng["numpy"])} for rng in state["rng"]]
    return {**state, "format": FORMAT, "rng": rngs}


def _read(file: Path, read):
    try:
        return read(file)
    except PlantedCode:  # never skipped for an older checkpoint: the user must know
        raise
    except Exception as err:  # noqa: BLE001 - every reader's own error type
        raise ValueError(f"{file.name} cannot be read ({first_line(err)})") from None


def remove_all(run_path: Path) -> None:
    shutil.rmtree(Path(run_path) / CHECKPOINTS, ignore_errors=True)
