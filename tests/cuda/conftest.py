"""The CUDA suite (`make test-cuda`, marker ``cuda``): what only a GPU can show. Without a
CUDA device every test here skips, with the reason; `make test` leaves the marker out.

``ADALORA_TEST_DEVICE=cpu`` rehearses the suite on the CPU (each "GPU" side then runs on the
CPU too), so a change to these tests can be tried on any machine before a GPU runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SMOKE = str(ROOT / "configs" / "smoke" / "glue.yaml")
GPU = torch.device(os.environ.get("ADALORA_TEST_DEVICE", "cuda"))
REHEARSAL = GPU.type == "cpu"


def pytest_collection_modifyitems(items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.cuda)
            if GPU.type == "cuda" and not torch.cuda.is_available():
                item.add_marker(pytest.mark.skip(reason="no CUDA device (make test-cuda "
                                                        "runs these on a GPU machine)"))


def adalora(*argv: str, fault: str | None = None, timeout: int = 600
            ) -> subprocess.CompletedProcess:
    """``adalora ARGV`` in a fresh interpreter (a CUDA context never survives a fork)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env.pop("ADALORA_FAULT", None)
    if fault:
        env["ADALORA_FAULT"] = fault
    return subprocess.run([sys.executable, "-m", "adalora_cli", *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def on_gpu(*overrides: str) -> list[str]:
    return [f"train.device={GPU}", *overrides]
