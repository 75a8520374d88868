"""From a config to the objects a run trains: resources, seed, device, model, data, method.

Everything here runs before a run directory exists, so every problem the user can fix
(a missing model folder, a device that is not there, an impossible schedule) is raised as
a one-line :class:`ConfigError` and leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from huggingface_hub.utils import HFValidationError

from .. import resources
from ..config import ConfigError, RunConfig
from ..errors import first_line
from ..methods import apply_method, parameter_table
from ..methods.base import MethodHandle
from ..methods.budget_params import budget_info
from ..methods.registry import check_method
from ..tasks import get_task, gguf
from ..tasks.base import Task, TaskData
from .distributed import World
from .schedule import total_steps


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


def pick_device(name: str) -> torch.device:
    """The device ``train.device`` names; checked before anything is written."""
    if not _DEVICE.match(name):
        raise ConfigError(f"train.device={name!r} is not a device; use auto, cpu, cuda or "
                          "cuda:N")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"train.device={name} but CUDA is not available; use "
                              "train.device=cpu (or auto)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"train.device={name} but only {torch.cuda.device_count()} "
                              "CUDA device(s) are visible; pick one of them")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"train.device={name} but MPS is not available; use train.device=cpu")
    return device


def autocast_factory(precision: str, device: torch.device):
    """Mixed precision on CUDA only; returns (context factory, dtype or None)."""
    if device.type != "cuda" or precision == "fp32":
        return contextlib.nullcontext, None
    if precision == "auto":
        precision = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return (lambda: torch.autocast("cuda", dtype=dtype)), dtype


def _looks_local(name: str) -> bool:
    """A path the user meant as a folder (not a hub id like ``microsoft/deberta-v3-base``)."""
    if name.startswith(("/", ".", "~")) or name.count("/") > 1 or "\\" in name:
        return True
    parent = Path(name).parent
    return str(parent) not in ("", ".") and parent.is_dir()


def load_model(task: Task, cfg: RunConfig, dtype: torch.dtype = torch.float32):
    """The task's pretrained model, its weights in ``dtype`` whatever dtype the checkpoint
    was stored in (tasks/pretrained.py), and its tokenizer; a missing model is a one-line
    error."""
    name = cfg.model.name_or_path
    if _looks_local(name) and not Path(name).expanduser().exists():
        raise ConfigError(f"model folder {name} does not exist; set model.name_or_path to a "
                          "local model folder or a hub id")
    try:
        return task.build_model(dtype=dtype)
    except (OSError, HFValidationError) as err:  # missing folder, unknown or unreachable hub id
        raise ConfigError(
            f"could not load model {name!r} ({first_line(err)}); "
            "set model.name_or_path to a local folder or check the network") from None


@contextlib.contextmanager
def weightless_loading():
    """Inside: every transformers ``from_pretrained`` builds its model from ``config.json``
    alone, and everything is created on the meta device (shapes and dtypes, no storage), so
    a 7B-shaped model costs nothing; a folder without a tokenizer gives ``None``.

    A dry run only counts parameters, and a task builds its model the way it builds it for
    training (the right head, a warm start), so the loading is intercepted here rather than
    taught to every task family."""
    from transformers import AutoTokenizer, PretrainedConfig, PreTrainedModel

    real_model = PreTrainedModel.__dict__["from_pretrained"]
    real_tokenizer = AutoTokenizer.__dict__["from_pretrained"]

    def from_config_only(cls, name, *args, config=None, **kwargs):
        if not isinstance(config, PretrainedConfig):
            config, kwargs = cls.config_class.from_pretrained(
                config or name, return_unused_kwargs=True, **kwargs)
        dtype = kwargs.get("dtype") or kwargs.get("torch_dtype")
        return cls._from_config(config, **({"dtype": dtype} if dtype else {}))

    def tokenizer_if_any(cls, *args, **kwargs):
        try:
            return real_tokenizer.__func__(cls, *args, **kwargs)
        except (OSError, ValueError):  # a config-only folder: nothing needs a tokenizer
            return None

    PreTrainedModel.from_pretrained = classmethod(from_config_only)
    AutoTokenizer.from_pretrained = classmethod(tokenizer_if_any)
    try:
        with torch.device("meta"):
            yield
    finally:
        PreTrainedModel.from_pretrained = real_model
        AutoTokenizer.from_pretrained = real_tokenizer


_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def base_dtype(cfg: RunConfig, device: torch.device) -> torch.dtype:
    """The dtype ``model.base_dtype`` asks for on ``device``; a half-precision base needs
    autocast (CUDA with mixed precision), since our fp32 adapters meet it in every layer."""
    name = cfg.model.base_dtype
    _, amp = autocast_factory(cfg.train.precision, device)
    if name == "auto":
        return amp if amp is torch.bfloat16 else torch.float32
    if name != "fp32" and amp is None:
        raise ConfigError(f"model.base_dtype={name} needs CUDA with mixed precision, but this "
                          f"run has device {device} and train.precision="
                          f"{cfg.train.precision}; use model.base_dtype=fp32 (or auto)")
    return _DTYPES[name]


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
    base_gguf: dict[str, Any] | None = None
    """A GGUF base's file, sha256 and size (tasks/gguf.py), hashed when it was loaded; None
    for any other checkpoint."""


def build_run(cfg: RunConfig, w: World | None = None) -> Built:
    """Seed, load, encode and attach the method; nothing touches the disk.

    Every rank of a distributed run builds the same model from the same seed; on CUDA each
    takes the GPU of its local rank."""
    device = pick_device(cfg.train.device)
    if w is not None and w.distributed and device.type == "cuda":
        device = torch.device("cuda", w.local_rank)
        torch.cuda.set_device(device)
    resolved = resolve_resources(cfg)
    seed_everything(cfg.train.seed)
    spec = check_method(cfg)  # an unknown method name fails before the model is loaded
    task = get_task(resolved)
    dtype = base_dtype(cfg, device)  # what the run asks for, not what the checkpoint stores
    model, tokenizer = load_model(task, resolved, dtype)
    data = task.load_data(tokenizer)
    if len(data.train) == 0:
        raise ConfigError("the training split is empty; check task.data_files / task.data_dir")
    steps = total_steps(len(data.train), cfg)
    handle = apply_method(model, resolved, steps)  # rejects an impossible schedule here
    if not spec.trains:
        steps = 0  # method none: the model is only evaluated
    elif not handle.trainable:  # e.g. BitFit on a model without biases (Llama)
        raise ConfigError(f"method {cfg.method.name} finds nothing to train in "
                          f"{type(model).__name__}; choose another method.name")
    trained_in_fp32(handle.trainable)
    cast_frozen(model, dtype)
    if cfg.train.gradient_checkpointing:
        enable_checkpointing(model)
    path = resolved.model.name_or_path
    base = gguf.describe(path) if gguf.is_gguf(path) else None
    return Built(cfg, task, model, tokenizer, data, handle, steps, device, base)


def dry_run(cfg: RunConfig) -> dict[str, Any]:
    """Build model and method on the meta device, train nothing; the per-module table plus
    the totals. Only ``config.json`` is read, so a 7B-shaped config takes seconds."""
    cfg = resolve_resources(cfg)
    check_method(cfg)
    with weightless_loading():
        model, _ = load_model(get_task(cfg), cfg, torch.float32)
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
    info.update(budget_info(cfg, handle))  # AdaLoRA: what trains at r0 vs what b(T) keeps
    return {"table": table, "info": info}
