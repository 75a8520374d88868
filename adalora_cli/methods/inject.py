"""Where methods attach: find target linear modules and replace them in place.

The defaults per model family live in ``targets.py``. A target matches an ``nn.Linear`` (or a
GPT-2 ``Conv1D``) whose module path equals it or ends with ``"." + target``,
so ``output.dense`` covers both ``layer.N.output.dense`` and ``layer.N.attention.output.dense``
(docs/maths.md#methods). Only modules inside the backbone (``model.base_model``) are
candidates: the task head trains in full and is never wrapped (BART's classification head has
an ``out_proj``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import nn

from ..config import ConfigError
from .base import LINEAR_TYPES
from .targets import ADAPTER_SITES, DEFAULT_TARGETS

__all__ = ["ADAPTER_SITES", "DEFAULT_TARGETS", "adapter_sites", "linear_names",
           "replace_linears", "resolve_targets"]


def model_type(model: nn.Module) -> str:
    config = getattr(model, "config", None)
    return getattr(config, "model_type", None) or type(model).__name__


def _matches(path: str, target: str) -> bool:
    return path == target or path.endswith("." + target)


def _backbone_linears(model: nn.Module) -> list[str]:
    """Paths (from the model root) of every linear layer inside ``model.base_model``, minus
    the output embeddings (the LM head of a model without a separate ``base_model``, T5)."""
    inside = {id(m) for m in getattr(model, "base_model", model).modules()}
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    return [path for path, m in model.named_modules()
            if isinstance(m, LINEAR_TYPES) and id(m) in inside and m is not head]


def linear_names(model: nn.Module) -> list[str]:
    """The distinct last names of the backbone's linear layers (``q_proj``, ``fc1``, ...),
    in model order: what a user can write in ``method.target_modules``."""
    return list(dict.fromkeys(p.rpartition(".")[2] for p in _backbone_linears(model)))


def _no_defaults(kind: str, model: nn.Module) -> ConfigError:
    names = linear_names(model)
    example = ",".join(names[:4]) or "q_proj,v_proj"
    return ConfigError(
        f"no default target modules for model type {kind}; its linear modules are "
        f"{', '.join(names) or 'none'}; set method.target_modules=[{example}] (names match "
        "the end of a module path)")


def resolve_targets(model: nn.Module, targets: Sequence[str] | None) -> list[str]:
    """Paths of the linear modules to adapt: ``targets`` or the model type's defaults."""
    if targets is None:
        kind = model_type(model)
        if kind not in DEFAULT_TARGETS:
            raise _no_defaults(kind, model)
        targets = DEFAULT_TARGETS[kind]
    paths = [p for p in _backbone_linears(model) if any(_matches(p, t) for t in targets)]
    if not paths:
        names = ", ".join(linear_names(model)) or "none"
        raise ConfigError(f"target modules {list(targets)} match no linear module in the "
                          f"{model_type(model)} backbone (its linear modules: {names}); fix "
                          "method.target_modules")
    return paths


def adapter_sites(model: nn.Module, attention: bool) -> list[str]:
    """Paths of the FFN output projections, plus the attention ones if ``attention``."""
    kind = model_type(model)
    if kind not in ADAPTER_SITES:
        raise ConfigError(f"no adapter placement known for model type {kind!r}; use "
                          "method.name=adalora or lora (with method.target_modules), or a "
                          f"model type among {', '.join(sorted(ADAPTER_SITES))}")
    attn_site, ffn_site = ADAPTER_SITES[kind]
    out = []
    for path in _backbone_linears(model):
        is_attn = _matches(path, attn_site)
        if (is_attn and attention) or (not is_attn and _matches(path, ffn_site)):
            out.append(path)
    return out


def replace_linears(model: nn.Module, paths: Sequence[str],
                    wrap: Callable[[nn.Module], nn.Module]) -> list[tuple[str, nn.Module]]:
    """Replace each module at ``paths`` by ``wrap(module)`` (setattr on its parent)."""
    out = []
    for path in paths:
        parent_path, _, name = path.rpartition(".")
        parent = model.get_submodule(parent_path) if parent_path else model
        new = wrap(getattr(parent, name))
        setattr(parent, name, new)
        out.append((path, new))
    return out
