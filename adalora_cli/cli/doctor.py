"""``adalora doctor``: what this machine gives a run, and whether a given config can start.

It prints torch's version and build (CUDA, ROCm or CPU only), the GPUs torch sees with
their memory and compute capability, whether bf16 is native on each GPU and on the CPU, what
``train.precision: auto`` becomes here, the libraries a run imports with the ranges adalora
declares, and whether the hub is reached online or read from the cache. With a config it
says where and in which precision that run would go. A config that asks for CUDA where none
is visible is refused in one line, with the reason and the fix, exit 2. ``adalora train``
refuses such a config too, before it writes anything. The command reads and changes
nothing: no download, no run directory.
"""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata

import typer

from .boundary import boundary, note, out

LIBRARIES = ("transformers", "datasets", "huggingface_hub", "tokenizers", "safetensors",
             "accelerate", "peft")
"""The libraries besides torch that a run imports (peft only for the tests), in the order
printed."""
TRUE = ("1", "on", "yes", "true")
"""The values huggingface_hub and datasets read as "on" in HF_HUB_OFFLINE and friends."""
INSTALL = "docs/reproducing.md#install-on-a-gpu-machine"


def doctor(
    config: str | None = typer.Argument(
        None, help="A run's config: say where and in which precision it would run here"),
    overrides: list[str] | None = typer.Argument(
        None, metavar="KEY=VALUE",
        help="Overrides of the config's keys, dotted, e.g. train.device=cuda"),
) -> None:
    """Check this machine before a run: torch's build, the GPUs it sees, bf16, versions, hub.

    Given CONFIG (and overrides) it also says on which device and in which precision that
    run would train, and exits 2 with one line naming the fix if the config asks for CUDA
    (train.device=cuda) where no CUDA device is visible.

    Examples:
      adalora doctor
      adalora doctor configs/glue/mnli.yaml
      adalora doctor configs/glue/mnli.yaml train.device=cuda

    Docs: docs/gpu.md#check-a-gpu-machine"""
    with boundary():
        import torch

        declared = _declared_ranges()
        rows = [("adalora", _adalora()),
                ("python", f"{platform.python_version()} ({sys.executable})"),
                ("torch", _version(torch.__version__, declared.get("torch"))
                 + f"; {_torch_build(torch)}"),
                *_gpus(torch),
                ("CPU", _cpu(torch)),
                ("precision", _auto_precision(torch)),
                *_libraries(declared),
                *_hub()]
        width = max(len(name) for name, _ in rows)
        for name, text in rows:
            out().print(f"{name:<{width}}  {text}", highlight=False, markup=False,
                        soft_wrap=True)
        if config is not None:
            out().print(f"{'run':<{width}}  {_run(torch, config, list(overrides or []))}",
                        highlight=False, markup=False, soft_wrap=True)


def _adalora() -> str:
    from pathlib import Path

    where = Path(__file__).resolve().parents[1]
    try:
        return f"{metadata.version('adalora')} ({where})"
    except metadata.PackageNotFoundError:  # a checkout that was never installed
        return f"not installed ({where}); make install"


def _torch_build(torch) -> str:
    if torch.version.cuda:
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        return f"built for CUDA {torch.version.cuda}" + (f", cuDNN {cudnn}" if cudnn else "")
    if getattr(torch.version, "hip", None):
        return f"built for ROCm {torch.version.hip}"
    return "a CPU-only build (no CUDA)"


def no_cuda_reason(torch) -> tuple[str, str]:
    """Why torch sees no CUDA device here, and what to do about it."""
    if not torch.version.cuda and not getattr(torch.version, "hip", None):
        return (f"torch {torch.__version__} is a CPU-only build",
                f"install torch's CUDA build into this environment ({INSTALL})")
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    if hidden is not None and hidden.strip() in ("", "-1"):
        return (f"CUDA_VISIBLE_DEVICES={hidden!r} hides every GPU",
                "unset CUDA_VISIBLE_DEVICES or name a GPU in it")
    return (f"torch {torch.__version__} finds no GPU: no NVIDIA driver, or one older than "
            f"CUDA {torch.version.cuda} needs",
            f"`nvidia-smi` shows what the driver sees; install the torch build for the "
            f"driver's CUDA version ({INSTALL})")


def _gpus(torch) -> list[tuple[str, str]]:
    from ..engine.precision import bf16_native

    if not torch.cuda.is_available():
        reason, fix = no_cuda_reason(torch)
        return [("CUDA", f"no device visible: {reason}; {fix}")]
    rows = [("CUDA", f"{torch.cuda.device_count()} device(s) visible")]
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        bf16 = "bf16 native" if bf16_native(torch.device("cuda", i)) else \
            "no native bf16 (auto runs fp16 with loss scaling)"
        rows.append((f"cuda:{i}", f"{p.name}, {p.total_memory / 2**30:.1f} GiB, compute "
                                  f"capability {p.major}.{p.minor}, {bf16}"))
    return rows


def _cpu(torch) -> str:
    from ..engine.precision import cpu_bf16_native

    bf16 = "bf16 native (AVX-512 BF16 or AMX)" if cpu_bf16_native() else \
        "no native bf16 (emulated: slow)"
    return (f"{os.cpu_count()} cores, torch uses {torch.get_num_threads()} threads; {bf16}")


def _auto_precision(torch) -> str:
    from ..engine.precision import resolve

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return (f"train.precision=auto runs {resolve('auto', device)} on {device}; "
            "the paper's runs were fp32 (docs/reproducing.md#which-precision)")


def _libraries(declared: dict) -> list[tuple[str, str]]:
    """Each library's installed version, against the range adalora declares for it."""
    rows = []
    for name in LIBRARIES:
        try:
            rows.append((name, _version(metadata.version(name), declared.get(name))))
        except metadata.PackageNotFoundError:
            rows.append((name, "not installed"))
    return rows


def _version(have: str, spec) -> str:
    """``have``, and whether it lies in ``spec`` (a SpecifierSet, or None: not declared)."""
    if spec is None:
        return have
    # lower bound first: >=2.13,<3 (a SpecifierSet prints its parts sorted as text)
    shown = ",".join(sorted(map(str, spec), key=lambda part: (part[0] != ">", part)))
    if spec.contains(have, prereleases=True):
        return f"{have} (adalora declares {shown})"
    return f"{have}, OUTSIDE adalora's {shown}: `make install` installs the tested versions"


def _declared_ranges() -> dict:
    """``{library: SpecifierSet}`` from adalora's installed metadata (empty for a checkout
    that was never installed)."""
    from packaging.requirements import Requirement

    try:
        requires = metadata.requires("adalora") or []
    except metadata.PackageNotFoundError:
        return {}
    ranges = {}
    for line in requires:
        req = Requirement(line)
        if req.marker is None:  # an extra's requirement says "; extra == ..."
            ranges[req.name.replace("-", "_").lower()] = req.specifier
    return ranges


def _hub() -> list[tuple[str, str]]:
    from huggingface_hub import constants

    offline = constants.HF_HUB_OFFLINE
    datasets_offline = offline or os.environ.get("HF_DATASETS_OFFLINE", "").lower() in TRUE
    if offline:
        reach = "offline (HF_HUB_OFFLINE): models only from the cache"
    else:
        reach = f"online: downloads from {constants.ENDPOINT}"
    data = "offline" if datasets_offline else "online"
    return [("hub", f"{reach}; data sets {data}; cache {constants.HF_HUB_CACHE}")]


def _run(torch, config: str, overrides: list[str]) -> str:
    """Where ``config`` would train here; a CUDA device that is not there is a ConfigError."""
    from ..config import ConfigError, load_config
    from ..engine.build import pick_device
    from ..engine.precision import requested, resolve

    cfg = load_config(config, overrides)
    asked = cfg.train.device
    if asked.startswith("cuda") and not torch.cuda.is_available():
        reason, fix = no_cuda_reason(torch)
        raise ConfigError(f"{config} asks for train.device={asked} but no CUDA device is "
                          f"visible: {reason}; {fix}")
    device = pick_device(asked)  # a cuda:N beyond the visible ones: refused here
    if asked == "auto" and device.type == "cpu":
        note(f"{config} would train on the CPU: {no_cuda_reason(torch)[0]}")
    words = requested(cfg)
    return (f"{config}: {cfg.model.name_or_path} on {device} (train.device={asked}) in "
            f"{resolve(words, device)} (train.precision={words})")
