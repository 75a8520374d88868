"""Declared versions are tested versions: pyproject's floors for the libraries whose
behaviour the suite pins are the very releases constraints.txt installs (and CI runs with),
and this environment holds what both allow."""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
FLOORED = ("transformers", "datasets", "huggingface_hub")
"""Pinned in constraints.txt and floored at that pin in pyproject.toml; torch comes from the
Makefile's TORCH_SPEC instead (a CPU or CUDA build)."""


def declared() -> dict[str, Requirement]:
    text = (ROOT / "pyproject.toml").read_text()  # tomllib is 3.11+; we support 3.10
    block = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M).group(1)
    reqs = [Requirement(r) for r in re.findall(r'^\s*"([^"]+)"', block, re.M)]
    return {r.name.lower().replace("-", "_"): r for r in reqs}


def pinned() -> dict[str, str]:
    found = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)==(\S+)", line.strip())
        if m:
            found[m.group(1).lower().replace("-", "_")] = m.group(2)
    return found


def floor(req: Requirement) -> Version:
    return next(Version(s.version) for s in req.specifier if s.operator == ">=")


@pytest.mark.parametrize("name", FLOORED)
def test_the_floor_is_the_pinned_release(name):
    req, pin = declared()[name], pinned()[name]
    assert floor(req) == Version(pin), f"{name}: floor {req}, constraints {pin}"
    assert req.specifier.contains(pin)


def test_every_pin_satisfies_what_pyproject_declares():
    reqs, pins = declared(), pinned()
    for name, req in reqs.items():
        if name in pins:
            assert req.specifier.contains(pins[name], prereleases=True), (name, pins[name])
    assert "torch" not in pins  # TORCH_SPEC decides it (a CPU wheel, or the CUDA build)


def test_this_environment_runs_declared_versions():
    for name in (*FLOORED, "torch", "tokenizers", "safetensors"):
        installed = version(name).split("+")[0]  # 2.13.0+cpu
        assert declared()[name].specifier.contains(installed), (name, installed)
