"""Declared versions are tested versions: every floor pyproject.toml declares, in the
dependencies and in each extra, is the release the suite ran with, which constraints.txt pins
(torch: the Makefile's TORCH_SPEC), and this environment holds what both allow. A floor below
that is honest only once the suite has passed in an environment at that floor; none has (the
lower floors tried failed it: README.md, "Versions"), so none is below. Every package the code
imports directly is declared, so none of them rides in untested on another's requirement."""

from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import packages_distributions, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = (ROOT / "pyproject.toml").read_text()  # tomllib is 3.11+; we support 3.10


def _requirements(block: str) -> list[Requirement]:
    return [Requirement(r) for r in re.findall(r'"([^"]+)"', block)]


def declared() -> dict[str, Requirement]:
    """[project.dependencies], by canonical name."""
    block = re.search(r"^dependencies = \[(.*?)^\]", PYPROJECT, re.S | re.M).group(1)
    return {canonicalize_name(r.name): r for r in _requirements(block)}


def extras() -> dict[str, list[Requirement]]:
    """[project.optional-dependencies], leaving out the extras made of other extras."""
    block = re.search(r"^\[project\.optional-dependencies\](.*?)^\[", PYPROJECT,
                      re.S | re.M).group(1)
    found = {}
    for extra, items in re.findall(r"^([a-z_-]+) = \[(.*?)\]$", block, re.M):
        reqs = _requirements(items)
        found[extra] = [r for r in reqs if canonicalize_name(r.name) != "adalora"]
    return found


def every_requirement() -> list[Requirement]:
    return [*declared().values(), *(r for reqs in extras().values() for r in reqs)]


def pinned() -> dict[str, str]:
    found = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)==(\S+)", line.strip())
        if m:
            found[canonicalize_name(m.group(1))] = m.group(2)
    return found


def suite_versions() -> dict[str, str]:
    """What the suite ran with: constraints.txt, and torch from the Makefile's TORCH_SPEC."""
    spec = re.search(r"^TORCH_SPEC\s*\?=\s*torch==(\S+)$",
                     (ROOT / "Makefile").read_text(), re.M).group(1)
    return {**pinned(), "torch": spec}


def floor(req: Requirement) -> Version | None:
    return next((Version(s.version) for s in req.specifier if s.operator == ">="), None)


@pytest.mark.parametrize("req", every_requirement(), ids=str)
def test_every_floor_is_the_tested_release(req):
    name = canonicalize_name(req.name)
    assert name in suite_versions(), f"{name} is declared but constraints.txt does not pin it"
    assert floor(req) == Version(suite_versions()[name]), (
        f"{req}: the suite ran with {name}=={suite_versions()[name]}; make that the floor")
    assert req.specifier.contains(suite_versions()[name])


def test_torch_comes_from_torch_spec():
    assert "torch" not in pinned()  # a CPU wheel, or the CUDA build: the Makefile decides
    assert suite_versions()["torch"] == "2.13.0"


def direct_imports() -> set[str]:
    """The distributions whose modules the package imports (lazily or not)."""
    owners = packages_distributions()
    found = set()
    for path in (ROOT / "adalora_cli").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for top in {n.split(".")[0] for n in names}:
                if top in sys.stdlib_module_names or top == "adalora_cli":
                    continue
                assert top in owners, f"{path.relative_to(ROOT)} imports {top}, not installed"
                found.update(canonicalize_name(d) for d in owners[top])
    return found


def test_every_package_imported_directly_is_declared():
    names = {canonicalize_name(r.name) for r in every_requirement()}
    missing = direct_imports() - names
    assert not missing, f"declare these in pyproject.toml (with the pinned floor): {missing}"
    assert {"numpy", "protobuf", "pillow", "packaging"} <= set(declared())


def test_this_environment_runs_declared_versions():
    for req in every_requirement():
        installed = version(req.name).split("+")[0]  # 2.13.0+cpu
        assert req.specifier.contains(installed), (req.name, installed)
