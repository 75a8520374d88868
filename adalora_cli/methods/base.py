"""What a fine-tuning method hands to the training loop.

The loop never branches on the method name. A method returns a :class:`MethodHandle`
holding the parameters to optimize and two optional hooks: a regularizer added to the
loss, and an after-step callback (AdaLoRA's rank allocator uses it to score and mask).
Adapter modules are found by type through the :class:`AdapterModule` protocol, never by
matching parameter-name strings.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from .allocator import RankAllocator


@runtime_checkable
class AdapterModule(Protocol):
    """A module that owns trainable adapter parameters (LoRA, SVD, bottleneck adapters)."""

    def adapter_parameters(self) -> Iterator[nn.Parameter]: ...


class LinearWrapper(nn.Module):
    """Wraps a frozen ``nn.Linear`` (``self.base``) and keeps its shape visible, so code
    that reads ``in_features`` / ``out_features`` keeps working after injection."""

    def __init__(self, base: nn.Linear):
        super().__init__()
        self.base = base

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features


def optional_dropout(p: float) -> nn.Module:
    """Dropout when p > 0; an identity (no RNG use, no copy) otherwise."""
    return nn.Dropout(p) if p > 0 else nn.Identity()


def adapter_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Every adapter module in the model, with its module path, in model order."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, AdapterModule)]


def head_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Parameters outside the pretrained backbone (``model.base_model``): the task head.

    Found by module identity, so tied weights (BART's lm_head = shared embeddings) are not
    counted as head."""
    base = getattr(model, "base_model", model)
    if base is model:
        return []
    in_base = {id(p) for p in base.parameters()}
    seen: set[int] = set()
    out = []
    for p in model.parameters():
        if id(p) not in in_base and id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def count(params: list[nn.Parameter]) -> int:
    return sum(p.numel() for p in params)


@dataclass
class MethodHandle:
    """The method's side of the training loop."""

    name: str
    adapter: list[nn.Parameter]
    """Method parameters (the paper's "# Params"); all of them for 'full'."""
    head: list[nn.Parameter]
    """Task-head parameters (trained by every method, counted separately)."""
    n_matrices: int = 0
    """Number of adapted weight matrices (0 for adapters, BitFit and full)."""
    reg_weight: float = 0.0
    """gamma: the loop adds reg_weight * regularizer() to the loss."""
    regularizer: Callable[[], torch.Tensor] | None = None
    """Unweighted regularizer R (logged as orth_reg)."""
    after_step: Callable[[int], dict[str, Any]] | None = None
    """Called with the optimizer step t (from 1) after optimizer.step() and before
    zero_grad(); returns values to log, e.g. {"budget": b_t} and, at mask events,
    {"ranks": {module path: rank}}."""
    allocator: RankAllocator | None = None
    """AdaLoRA's (or prune-LoRA's) rank allocator; its state is checkpointed and its final
    pattern written to the run directory. None for every other method and in a dry run."""
    layers: list[tuple[str, nn.Module]] = field(default_factory=list)
    """The injected adapter modules by module path (empty for BitFit and full)."""

    @property
    def trainable(self) -> list[nn.Parameter]:
        seen: set[int] = set()
        out = []
        for p in [*self.adapter, *self.head]:
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
        return out

    @property
    def adapter_params(self) -> int:
        return count(self.adapter)

    @property
    def head_params(self) -> int:
        return count(self.head)
