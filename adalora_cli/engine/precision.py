"""How a run computes, decided once: :func:`decide` turns ``train.precision`` and
``model.base_dtype`` on the run's device into one :class:`Precision` record (the autocast that
runs, its dtype, whether fp16 loss scaling is on, the frozen base's dtype, and whether the
device computes bf16 in hardware). The build decides it and keeps it on ``Built``; the step,
the loop, the header, the notes, the summary and the FSDP checks read the record, and no
module but this one reads ``train.precision`` (tests/engine/test_precision_key.py).

CUDA: ``auto`` is bf16 where the GPU runs it natively and fp16 with loss scaling elsewhere.
CPU: ``bf16`` autocasts to bf16 (docs/training.md#precision); ``auto`` does too where the CPU
computes bf16 natively (:func:`cpu_bf16_native`; there the demo's step took 0.47-0.84x fp32's
time in 6 of 7 readings, at the fp32 seeds' accuracy, docs/speed.md) and is fp32 elsewhere;
``fp16`` is fp32 (fp16 autocast is for GPUs). Other devices: fp32.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..config import ConfigError, RunConfig

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def dtype_name(dtype: torch.dtype) -> str:
    """fp32, bf16 or fp16: a dtype in the config's words."""
    return next(name for name, d in _DTYPES.items() if d is dtype)


def bf16_native(device: torch.device) -> bool:
    """Whether the GPU computes bf16 in hardware: compute capability 8.0 or higher (A100,
    A10, L4, RTX 30xx/40xx, H100), or any ROCm GPU. Not ``torch.cuda.is_bf16_supported()``:
    it also says True on V100 and T4 (7.x), where bf16 is only emulated, without tensor
    cores and far slower than fp16."""
    if torch.version.hip:
        return True
    return torch.cuda.get_device_capability(device)[0] >= 8


def cpu_bf16_native() -> bool:
    """Whether this CPU computes bf16 in hardware: AVX-512 BF16 or AMX tiles (Intel Cooper
    Lake, Sapphire Rapids and later; AMD Zen 4 and later), as torch's oneDNN dispatch reads
    them from CPUID. Elsewhere bf16 autocast converts in software, many times slower than fp32."""
    cpu = torch.cpu
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    if all(hasattr(cpu, name) for name in checks):
        return any(getattr(cpu, name)() for name in checks)
    try:  # an older or newer torch without those helpers: the kernel's flags say the same
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` computes bf16 in hardware (False for devices other than CUDA and
    the CPU)."""
    if device.type == "cuda":
        return bf16_native(device)
    return device.type == "cpu" and cpu_bf16_native()


def resolve(asked: str, device: torch.device) -> str:
    """The autocast precision (fp32, bf16 or fp16) that a ``train.precision`` value runs on
    ``device`` (the module's docstring says which, and why)."""
    if asked == "fp32":
        return "fp32"
    if device.type == "cuda":
        if asked == "auto":
            return "bf16" if bf16_native(device) else "fp16"
        return asked
    if device.type == "cpu" and (asked == "bf16"
                                 or asked == "auto" and cpu_bf16_native()):
        return "bf16"
    return "fp32"


def requested(cfg: RunConfig) -> str:
    """``train.precision`` as the config writes it (auto, fp32, bf16 or fp16), for a command
    that scores a finished run in a precision the user asks for (``adalora eval``)."""
    return cfg.train.precision


def _base(cfg: RunConfig, device: torch.device, autocast: str) -> torch.dtype:
    """The dtype ``model.base_dtype`` asks for under ``autocast`` on ``device``; a
    half-precision base needs autocast (CUDA with mixed precision, or bf16 on a CPU), since
    our fp32 adapters meet it in every layer."""
    name = cfg.model.base_dtype
    amp = _DTYPES[autocast] if autocast != "fp32" else None
    if name == "fp16" and device.type == "cpu":
        # the CPU's only autocast is bf16, and its kernels refuse an fp16 weight beside a
        # bf16 or fp32 input ("mixed dtype (CPU)" at the first step, after the run began)
        raise ConfigError(f"model.base_dtype=fp16 does not run on a CPU (device {device}): "
                          "its one half precision is bf16; use model.base_dtype=bf16 with "
                          "train.precision=bf16, or model.base_dtype=fp32 (or auto)")
    if name == "auto":
        return amp if amp is torch.bfloat16 else torch.float32
    if name != "fp32" and amp is None:
        raise ConfigError(f"model.base_dtype={name} needs mixed precision (CUDA, or "
                          f"train.precision=bf16 on a CPU), but this run has device {device} "
                          f"and train.precision={cfg.train.precision}; use "
                          "model.base_dtype=fp32 (or auto)")
    return _DTYPES[name]


def as_configured(cfg: RunConfig, device: torch.device) -> tuple[str, str]:
    """(autocast, base dtype), in the config's words, that a run of ``cfg`` had on
    ``device``; a half-precision base this device cannot run counts as fp32. For a finished
    run older than the summary's record of what ran (artifacts/scoring.py)."""
    autocast = resolve(cfg.train.precision, device)
    try:
        base = dtype_name(_base(cfg, device, autocast))
    except ConfigError:
        base = "fp32"
    return autocast, base


@dataclass(frozen=True)
class Precision:
    """What a run computes in on its device, decided once (:func:`decide`)."""

    asked: str
    """``train.precision`` as the config writes it: auto, fp32, bf16 or fp16."""
    device: torch.device
    autocast: str = "fp32"
    """The autocast precision that runs: fp32, bf16 or fp16."""
    base_dtype: torch.dtype = torch.float32
    """The dtype of the frozen base weights (adapters and head stay fp32)."""
    native_bf16: bool = False
    """Whether the device computes bf16 in hardware (:func:`native_bf16`)."""
    base_quant: str = "none"
    """``model.quantize``: nf4 stores the frozen base's linear weights in 4 bits, dequantized
    to ``base_dtype`` in each forward (engine/quantize.py)."""

    @classmethod
    def of(cls, asked: str, device: torch.device,
           base_dtype: torch.dtype = torch.float32) -> Precision:
        """A ``train.precision`` value on ``device``, without a config (benchmarks, tests)."""
        return cls(asked, device, resolve(asked, device), base_dtype, native_bf16(device))

    @property
    def amp_dtype(self) -> torch.dtype | None:
        """The autocast dtype; None for fp32 (no autocast)."""
        return None if self.autocast == "fp32" else _DTYPES[self.autocast]

    @property
    def loss_scaling(self) -> bool:
        """fp16 autocast needs a loss scaler; bf16 and fp32 do not."""
        return self.autocast == "fp16"

    def context(self) -> Callable[[], Any]:
        """A factory of the autocast context every forward runs in (a no-op for fp32)."""
        dtype = self.amp_dtype
        if dtype is None:
            return contextlib.nullcontext
        device_type = self.device.type
        return lambda: torch.autocast(device_type, dtype=dtype)

    def warning(self) -> str | None:
        """One line for stderr where what runs is not what the words suggest; else None."""
        if self.autocast == "bf16" and not self.native_bf16:
            if self.device.type == "cuda":
                return (f"warning: train.precision=bf16 on "
                        f"{torch.cuda.get_device_name(self.device)}, which only emulates bf16 "
                        "(slower than fp16); train.precision=auto picks fp16 with loss "
                        "scaling there")
            if self.device.type == "cpu":
                return ("warning: train.precision=bf16 on a CPU without native bf16 (no "
                        "AVX-512 BF16 or AMX): autocast converts in software, many times "
                        "slower than fp32 (train.precision=fp32)")
        if self.asked == "fp16" and self.device.type == "cpu":
            return ("note: train.precision=fp16 runs in fp32 on the CPU (fp16 autocast is for "
                    "GPUs; train.precision=bf16 is the CPU's half precision)")
        return None

    def record(self, skipped_steps: int) -> dict[str, Any]:
        """What ran, for summary.json: the autocast, the frozen base's dtype, whether fp16
        loss scaling was on, and how many steps it skipped (all attempts); ``base_quant``
        for a 4-bit base."""
        out = {"autocast": self.autocast, "base_dtype": dtype_name(self.base_dtype),
               "loss_scaling": self.loss_scaling, "skipped_steps": skipped_steps}
        if self.base_quant != "none":
            out["base_quant"] = self.base_quant
        return out


def decide(cfg: RunConfig, device: torch.device) -> Precision:
    """``train.precision`` and ``model.base_dtype`` on ``device``, checked: a half-precision
    base the device cannot run is a one-line ConfigError here, before anything loads."""
    asked = cfg.train.precision
    autocast = resolve(asked, device)
    return Precision(asked, device, autocast, _base(cfg, device, autocast),
                     native_bf16(device), cfg.model.quantize)
