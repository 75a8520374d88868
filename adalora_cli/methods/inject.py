"""Where methods attach: find target ``nn.Linear`` modules and replace them in place.

A target matches an ``nn.Linear`` whose module path equals it or ends with ``"." + target``,
so ``output.dense`` covers both ``layer.N.output.dense`` and ``layer.N.attention.output.dense``
(docs/maths.md#methods). Only modules inside the backbone (``model.base_model``) are
candidates: the task head trains in full and is never wrapped (BART's classification head has
an ``out_proj``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import nn

from ..config import ConfigError

_BERT_TARGETS = ("query", "key", "value", "attention.output.dense", "intermediate.dense",
                 "output.dense")

DEFAULT_TARGETS: dict[str, tuple[str, ...]] = {
    "deberta-v2": ("query_proj", "key_proj", "value_proj", "attention.output.dense",
                   "intermediate.dense", "output.dense"),
    "bert": _BERT_TARGETS,
    "roberta": _BERT_TARGETS,
    "bart": ("q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"),
}
"""Every attention and FFN matrix of every layer ("all matrices" in the paper)."""

_BERT_SITES = ("attention.output.dense", "output.dense")

ADAPTER_SITES: dict[str, tuple[str, str]] = {
    "deberta-v2": _BERT_SITES,
    "bert": _BERT_SITES,
    "roberta": _BERT_SITES,
    "bart": ("self_attn.out_proj", "fc2"),
}
"""(attention output projection, FFN output projection) per model type; the FFN site never
includes a module that is also the attention site."""


def model_type(model: nn.Module) -> str:
    config = getattr(model, "config", None)
    return getattr(config, "model_type", None) or type(model).__name__


def _matches(path: str, target: str) -> bool:
    return path == target or path.endswith("." + target)


def _backbone_linears(model: nn.Module) -> list[str]:
    """Paths (from the model root) of every ``nn.Linear`` inside ``model.base_model``."""
    inside = {id(m) for m in getattr(model, "base_model", model).modules()}
    return [path for path, m in model.named_modules()
            if isinstance(m, nn.Linear) and id(m) in inside]


def resolve_targets(model: nn.Module, targets: Sequence[str] | None) -> list[str]:
    """Paths of the linear modules to adapt: ``targets`` or the model type's defaults."""
    if targets is None:
        kind = model_type(model)
        if kind not in DEFAULT_TARGETS:
            raise ConfigError(f"no default target modules for model type {kind}; "
                              "set method.target_modules=...")
        targets = DEFAULT_TARGETS[kind]
    paths = [p for p in _backbone_linears(model) if any(_matches(p, t) for t in targets)]
    if not paths:
        raise ConfigError(f"target modules {list(targets)} match no nn.Linear in the "
                          f"{model_type(model)} backbone; fix method.target_modules")
    return paths


def adapter_sites(model: nn.Module, attention: bool) -> list[str]:
    """Paths of the FFN output projections, plus the attention ones if ``attention``."""
    kind = model_type(model)
    if kind not in ADAPTER_SITES:
        raise ConfigError(f"no adapter placement known for model type {kind}; "
                          f"supported: {', '.join(sorted(ADAPTER_SITES))}")
    attn_site, ffn_site = ADAPTER_SITES[kind]
    out = []
    for path in _backbone_linears(model):
        is_attn = _matches(path, attn_site)
        if (is_attn and attention) or (not is_attn and _matches(path, ffn_site)):
            out.append(path)
    return out


def replace_linears(model: nn.Module, paths: Sequence[str],
                    wrap: Callable[[nn.Linear], nn.Module]) -> list[tuple[str, nn.Module]]:
    """Replace each module at ``paths`` by ``wrap(module)`` (setattr on its parent)."""
    out = []
    for path in paths:
        parent_path, _, name = path.rpartition(".")
        parent = model.get_submodule(parent_path) if parent_path else model
        new = wrap(getattr(parent, name))
        setattr(parent, name, new)
        out.append((path, new))
    return out
