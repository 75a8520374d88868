"""``train.precision: auto`` and ``model.base_dtype: auto`` on GPUs this machine does not
have: torch's CUDA queries are answered as a V100, a T4, an A100 and an H100 answer them.
``torch.cuda.is_bf16_supported()`` says True on all four (V100 and T4 emulate bf16), so the
choice must come from the compute capability."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from adalora_cli.engine import build
from adalora_cli.engine.build import autocast_factory, base_dtype, bf16_native, resolve_precision
from tests.methods._tiny import run_config

CUDA = torch.device("cuda")
GPUS = {"V100": (7, 0), "T4": (7, 5), "A100": (8, 0), "RTX 4090": (8, 9), "H100": (9, 0)}


@pytest.fixture()
def gpu(monkeypatch):
    """``gpu(name)``: torch.cuda answers as that GPU (CUDA build, not ROCm)."""

    def as_gpu(name: str) -> None:
        major, minor = GPUS[name]
        monkeypatch.setattr(torch.version, "hip", None)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (major, minor))
        monkeypatch.setattr(torch.cuda, "get_device_properties",
                            lambda d=None: SimpleNamespace(major=major, minor=minor))
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: f"NVIDIA {name}")
        # the emulation probe: creating a bf16 tensor works on every CUDA GPU
        monkeypatch.setattr(torch.cuda, "_check_bf16_tensor_supported", lambda d: True,
                            raising=False)
    return as_gpu


@pytest.mark.parametrize("name, native", [("V100", False), ("T4", False), ("A100", True),
                                          ("RTX 4090", True), ("H100", True)])
def test_auto_is_bf16_only_where_bf16_is_native(gpu, name, native):
    gpu(name)
    assert torch.cuda.is_bf16_supported()  # what the old test said: True even on a V100
    assert bf16_native(CUDA) is native
    # torch's own answer without emulation agrees wherever torch has it (2.4 and later)
    assert torch.cuda.is_bf16_supported(including_emulation=False) is native
    auto = "bf16" if native else "fp16"
    assert resolve_precision("auto", CUDA) == auto
    assert autocast_factory("auto", CUDA)[1] is (torch.bfloat16 if native else torch.float16)
    # an explicit choice is kept, fp32 means no autocast, and the CPU is always fp32
    assert [resolve_precision(p, CUDA) for p in ("bf16", "fp16", "fp32")] == [
        "bf16", "fp16", "fp32"]
    assert autocast_factory("fp32", CUDA)[1] is None
    assert resolve_precision("auto", torch.device("cpu")) == "fp32"


@pytest.mark.parametrize("name, expected", [("V100", torch.float32), ("A100", torch.bfloat16)])
def test_base_dtype_auto_follows_the_same_decision(gpu, name, expected):
    """A bf16 base only under bf16 autocast; under fp16 autocast the base stays fp32."""
    gpu(name)
    assert base_dtype(run_config("lora", model={"base_dtype": "auto"}), CUDA) is expected
    assert base_dtype(run_config("lora", model={"base_dtype": "fp16"}), CUDA) is torch.float16


def test_rocm_runs_bf16(gpu, monkeypatch):
    gpu("V100")
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert resolve_precision("auto", CUDA) == "bf16"


def test_dtype_names_are_the_config_s():
    assert [build.dtype_name(d) for d in (torch.float32, torch.bfloat16, torch.float16)] == [
        "fp32", "bf16", "fp16"]
