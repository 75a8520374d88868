"""From a config to the objects a run trains: resources, seed, device, model, data, method.

Everything here runs before a run directory exists, so every problem the user can fix
(a missing model folder, a device that is not there, an impossible schedule) is raised as
a one-line :class:`ConfigError` and leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError

from .. import resources
from ..config import ConfigError, RunConfig
from ..errors import first_line
from ..methods import apply_method
from ..methods.base import MethodHandle
from ..methods.registry import check_method, config_value
from ..tasks import get_task, gguf
from ..tasks.base import Task, TaskData
from ..tasks.pretrained import LOAD_ERRORS, load_failed
from . import quantize, selection, sharding
from .distributed import World
from .precision import Precision, decide
from .schedule import total_steps
from .weightless import weightless_loading


def resolve_resources(cfg: RunConfig) -> RunConfig:
    """Turn ``package:`` paths into real paths (the demo's bundled weights and data), and a
    GGUF base (``model.gguf_file``, a ``.gguf`` path or a folder holding one) into the path
    of its ``.gguf`` file, the one form every loader takes (tasks/gguf.py)."""
    task = cfg.task
    files = ({k: resources.resolve(v) for k, v in task.data_files.items()}
             if task.data_files else None)
    task = dataclasses.replace(
        task, data_files=files,
        data_dir=resources.resolve(task.data_dir) if task.data_dir else None)
    m = cfg.model
    path = gguf.locate(resources.resolve(m.name_or_path),
                       resources.resolve(m.gguf_file) if m.gguf_file else None)
    model = dataclasses.replace(m, name_or_path=path, gguf_file=None)
    return dataclasses.replace(cfg, task=task, model=model)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?|mps)$")


def pick_device(name: str, setting: str = "train.device") -> torch.device:
    """The device ``name`` names; checked before anything is written. ``setting`` is where
    the user wrote it (``train.device``, or ``--device`` for predict), for the messages."""
    def said(value: str) -> str:  # a config key takes key=value, an option takes --opt value
        return f"{setting}={value}" if not setting.startswith("-") else f"{setting} {value}"

    if not _DEVICE.match(name):
        raise ConfigError(f"{said(repr(name))} is not a device; use auto, cpu, cuda or "
                          "cuda:N")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"{said(name)} but CUDA is not available; use {said('cpu')} "
                              "(or auto)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"{said(name)} but only {torch.cuda.device_count()} "
                              "CUDA device(s) are visible; pick one of them")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"{said(name)} but MPS is not available; use {said('cpu')}")
    return device


def _looks_local(name: str) -> bool:
    """A path the user meant as a folder (not a hub id like ``microsoft/deberta-v3-base``)."""
    if name.startswith(("/", ".", "~")) or name.count("/") > 1 or "\\" in name:
        return True
    parent = Path(name).parent
    return str(parent) not in ("", ".") and parent.is_dir()


def check_model_folder(name: str) -> None:
    """A local model folder must hold a transformers checkpoint (``config.json``): a one-line
    error otherwise. (A folder holding a GGUF file instead was already turned into that
    file's path by :func:`resolve_resources`.)"""
    folder = Path(name).expanduser()
    if not folder.is_dir() or (folder / "config.json").is_file():
        return
    raise ConfigError(f"model folder {name} has no config.json; set model.name_or_path to a "
                      "checkpoint folder (config.json, weights, tokenizer), a .gguf file or a "
                      "hub id")


def load_model(task: Task, cfg: RunConfig, dtype: torch.dtype = torch.float32):
    """The task's pretrained model, its weights in ``dtype`` whatever dtype the checkpoint
    was stored in (tasks/pretrained.py), and its tokenizer; a missing model is a one-line
    error."""
    name = cfg.model.name_or_path
    if _looks_local(name) and not Path(name).expanduser().exists():
        raise ConfigError(f"model folder {name} does not exist; set model.name_or_path to a "
                          "local model folder or a hub id")
    check_model_folder(name)
    try:
        check_model_type(name)
        return task.build_model(dtype=dtype)
    except LOAD_ERRORS as err:  # missing folder, unknown, unreachable or gated hub repo
        raise load_failed(name, err) from None
    except SafetensorError as err:  # a weights file cut short (an interrupted download)
        file = damaged_weights(name)
        what = str(file) if file else f"a weights file of model {name}"
        raise ConfigError(f"{what} cannot be read ({first_line(err)}): it is damaged or "
                          "truncated (an interrupted download?); download or copy it again"
                          ) from None


def damaged_weights(folder: str) -> Path | None:
    """The first ``*.safetensors`` file in a local model folder whose header does not read
    (only headers are read: cheap even for a 7B checkpoint)."""
    from safetensors import safe_open

    path = Path(folder).expanduser()
    for file in sorted(path.glob("*.safetensors")) if path.is_dir() else []:
        try:
            with safe_open(str(file), "pt"):
                pass
        except SafetensorError:
            return file
    return None


def check_model_type(name: str) -> None:
    """A model whose ``config.json`` names no architecture transformers knows (no
    ``model_type``, or a misspelt or too new one) is a one-line ConfigError, not a crash.
    A GGUF file is left to its reader, which says so in one line (tasks/gguf.py)."""
    from transformers import AutoConfig

    if gguf.is_gguf(name):
        return
    try:
        AutoConfig.from_pretrained(name)
    except ValueError as err:  # AutoConfig's word for "cannot tell what this model is"
        raise ConfigError(_unknown_model(name, err)) from None


def _unknown_model(name: str, err: ValueError) -> str:
    import difflib
    import json

    import transformers
    from transformers import CONFIG_MAPPING

    file = Path(name).expanduser() / "config.json"
    try:
        kind = json.loads(file.read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):  # a hub id, or no JSON object
        return (f"could not tell which architecture model {name} is ({first_line(err)}); "
                "check model.name_or_path")
    if not kind:
        return (f"{file} has no model_type, so transformers cannot tell which architecture "
                'it is; add one (e.g. "model_type": "llama") or use the folder '
                "save_pretrained wrote")
    close = difflib.get_close_matches(str(kind), list(CONFIG_MAPPING.keys()), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return (f"{file} has model_type {kind!r}, which transformers {transformers.__version__} "
            f"does not know; {hint}fix it, or upgrade transformers if the architecture is "
            "newer")


def cast_frozen(model: torch.nn.Module, dtype: torch.dtype) -> int:
    """Cast every frozen floating-point parameter to ``dtype`` (the trained adapter and head
    keep fp32, which the optimizer needs); returns how many were cast."""
    if dtype is torch.float32:
        return 0
    cast = 0
    for p in model.parameters():
        if not p.requires_grad and p.is_floating_point() and p.dtype != dtype:
            p.data = p.data.to(dtype)
            cast += 1
    return cast


def trained_in_fp32(params: list[torch.nn.Parameter]) -> int:
    """Make every trained parameter fp32: a head created beside a half-precision base is
    made in the base's dtype, and AdamW in fp16 loses its epsilon (1e-8 rounds to 0) and
    most updates. Mixed precision comes from autocast only. Returns how many were cast."""
    cast = 0
    for p in params:
        if p.is_floating_point() and p.dtype != torch.float32:
            p.data = p.data.float()
            cast += 1
    return cast


def no_kv_cache(model: torch.nn.Module) -> None:
    """A training forward builds no key/value cache: nothing reads it, it costs memory,
    and building it changes GPT-2's arithmetic (its attention then runs on the cache's
    copies), so gradients with ``train.gradient_checkpointing``, which turns the cache off,
    differed from those without in the last bits. A forward hook passes ``use_cache=False``
    in training mode only: generation and scoring (eval mode) are untouched, and so is the
    config a ``full`` run saves."""
    import inspect

    if "use_cache" not in inspect.signature(model.forward).parameters:
        return  # an encoder (BERT): it has no cache to turn off

    def hook(module, args, kwargs):
        if module.training:
            kwargs["use_cache"] = False
        return args, kwargs

    model.register_forward_pre_hook(hook, with_kwargs=True)


def enable_checkpointing(model: torch.nn.Module) -> None:
    """``train.gradient_checkpointing``: recompute activations in the backward pass. The
    non-reentrant form works with a frozen base (no input needs a gradient)."""
    enable = (getattr(model, "activation_checkpointing_enable", None)
              or getattr(model, "gradient_checkpointing_enable", None))
    if enable is None or not getattr(model, "supports_gradient_checkpointing", False):
        raise ConfigError(f"{type(model).__name__} does not support gradient checkpointing; "
                          "set train.gradient_checkpointing=false")
    # the checkpointed layers drop the KV cache in training themselves; generation at
    # evaluation keeps it
    enable({"use_reentrant": False})


@dataclass
class Built:
    """Everything a run trains, built and checked, before any output is written."""

    cfg: RunConfig
    """The run's config as the user wrote it (portable ``package:`` paths kept)."""
    task: Task
    model: torch.nn.Module
    tokenizer: Any
    data: TaskData
    handle: MethodHandle
    steps: int
    device: torch.device
    precision: Precision
    """What the run computes in, decided once (precision.py): every reader after the build
    takes the autocast, the loss scaling and the base dtype from here."""
    base_gguf: dict[str, Any] | None = None
    """A GGUF base's file, sha256 and size (tasks/gguf.py), hashed when it was loaded; None
    for any other checkpoint."""


def run_device(cfg: RunConfig, w: World | None = None) -> torch.device:
    """The device ``train.device`` names (one that is not there is refused here); on CUDA
    each process of a distributed run takes the GPU of its local rank."""
    device = pick_device(cfg.train.device)
    if w is not None and w.distributed and device.type == "cuda":
        device = torch.device("cuda", w.local_rank)
        torch.cuda.set_device(device)
    return device


def check_batches(cfg: RunConfig, key: str | None, n_train: int) -> None:
    """The pass's batch count (config ``key``) within one epoch of the training data, or a
    one-line ConfigError naming both numbers and the fix."""
    if key is None:
        return
    n = config_value(cfg, key)
    have = math.ceil(n_train / cfg.train.batch_size)
    if n is not None and n > have:
        raise ConfigError(
            f"{key}={n} but the training split holds only {have} batches of "
            f"train.batch_size={cfg.train.batch_size} ({n_train} examples); lower {key} to "
            f"at most {have} (or leave it unset: up to one epoch)")


def build_run(cfg: RunConfig, w: World | None = None,
              precision: Precision | None = None) -> Built:
    """Seed, load, encode and attach the method; nothing touches the disk.

    Every rank of a distributed run builds the same model from the same seed; on CUDA each
    takes the GPU of its local rank. ``precision``: decided on :func:`run_device` by a
    caller that said it before the load (loop.py), else decided here."""
    if precision is None:
        precision = decide(cfg, run_device(cfg, w))
    device = precision.device
    resolved = resolve_resources(cfg)
    seed_everything(cfg.train.seed)
    spec = check_method(cfg)  # an unknown method name fails before the model is loaded
    sharding.check(cfg, w or World(), precision)
    quantize.check(resolved, spec.trains_base, resolved.model.name_or_path)
    task = get_task(resolved)
    dtype = precision.base_dtype  # what the run asks for, not what the checkpoint stores
    # a sharded run's ranks but 0 build shapes only: rank 0 sends their rows (sharding.py)
    with weightless_loading() if sharding.lean(cfg, w) else contextlib.nullcontext():
        model, tokenizer = load_model(task, resolved, dtype)
    data = task.load_data(tokenizer)
    if len(data.train) == 0:
        raise ConfigError("the training split is empty; check task.data_files / task.data_dir")
    check_batches(cfg, spec.pass_batches, len(data.train))  # a pass before training
    selection.plan(cfg, task, list(data.eval_splits))  # train.select_metric: one the task reports
    steps = total_steps(len(data.train), cfg)
    handle = apply_method(model, resolved, steps)  # rejects an impossible schedule here
    cfg = cfg.with_final_budget(handle.n_matrices)  # adalora.target_rank -> its b(T)
    cfg = cfg.with_values(handle.settled)  # e.g. the digest of the ranks LoRA trains on
    cfg = task.recorded(cfg)  # e.g. the labels a classifier read from its data
    if not spec.trains:
        steps = 0  # method none: the model is only evaluated
    elif not handle.trainable:  # e.g. BitFit on a model without biases (Llama)
        raise ConfigError(f"method {cfg.method.name} finds nothing to train in "
                          f"{type(model).__name__}; choose another method.name")
    trained_in_fp32(handle.trainable)
    cast_frozen(model, dtype)
    notes = [precision.warning()]
    if cfg.model.quantize == "nf4":  # after the cast: NF4 dequantizes to the base's dtype
        notes.append(quantize.quantize_base(model).note(dtype))
    no_kv_cache(model)
    if cfg.train.gradient_checkpointing:
        enable_checkpointing(model)
    if sharding.enabled(cfg):
        sharding.find_blocks(model)  # a model it cannot shard is refused here
    for note in notes:
        if note and (w is None or w.main):
            print(note, file=sys.stderr, flush=True)
    path = resolved.model.name_or_path
    # the file and its hash, and where it came from (a hub repo, a package) when known
    base = ({**gguf.describe(path), **gguf.origin(path, (cfg.model.name_or_path,
                                                          cfg.model.gguf_file))}
            if gguf.is_gguf(path) else None)
    return Built(cfg, task, model, tokenizer, data, handle, steps, device, precision, base)
