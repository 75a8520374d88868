"""What a fine-tuning method hands to the training loop.

The loop never branches on the method name. A method returns a :class:`MethodHandle`
holding the parameters to optimize and two optional hooks: a regularizer added to the
loss, and an after-step callback (AdaLoRA's rank allocator uses it to score and mask; SoRA's
proximal step and IncreLoRA's growth use it too). A method that trains some parameters at
another learning rate (LoRA+) or without weight decay (SoRA's gates) says so with
:class:`ParamGroup` objects, which the optimizer is built from. Adapter modules are found by type
through the :class:`AdapterModule` protocol, never by matching parameter-name strings.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from .allocator import StepReport


@runtime_checkable
class AdapterModule(Protocol):
    """A module that owns trainable adapter parameters (LoRA, SVD, bottleneck adapters)."""

    def adapter_parameters(self) -> Iterator[nn.Parameter]: ...


LINEAR_TYPES: tuple[type[nn.Module], ...] = (nn.Linear, Conv1D)
"""Layers a method can wrap: ``nn.Linear`` and transformers' ``Conv1D`` (GPT-2's family),
which computes the same ``x W^T + b`` but stores ``W`` transposed, as ``(d_in, d_out)``."""


def is_transposed(module: nn.Module) -> bool:
    """True for a ``Conv1D``: its ``weight`` is ``(d_in, d_out)`` (PEFT's fan_in_fan_out)."""
    return isinstance(module, Conv1D)


def linear_dims(module: nn.Module) -> tuple[int, int]:
    """``(d_out, d_in)`` of an ``nn.Linear`` or a ``Conv1D``."""
    d0, d1 = module.weight.shape
    return (d1, d0) if is_transposed(module) else (d0, d1)


class LinearWrapper(nn.Module):
    """Wraps a frozen linear layer (``self.base``: ``nn.Linear`` or ``Conv1D``) and keeps
    its shape visible, so code that reads ``in_features`` / ``out_features`` keeps working
    after injection. The adapters always work in ``nn.Linear``'s ``(d_out, d_in)`` layout;
    :meth:`to_base_layout` turns such a matrix into the base's own layout."""

    def __init__(self, base: nn.Module):
        super().__init__()
        self.base = base

    @property
    def in_features(self) -> int:
        return linear_dims(self.base)[1]

    @property
    def out_features(self) -> int:
        return linear_dims(self.base)[0]

    @property
    def weight(self) -> torch.Tensor:
        """The frozen base weight: model code reads it (T5 checks ``wo.weight.dtype``)."""
        return self.base.weight

    @property
    def fan_in_fan_out(self) -> bool:
        return is_transposed(self.base)

    def to_base_layout(self, delta: torch.Tensor) -> torch.Tensor:
        """A ``(d_out, d_in)`` matrix in the layout of ``base.weight`` (transposed for
        ``Conv1D``), so that ``base.weight + to_base_layout(Delta W)`` merges it."""
        return delta.T if self.fan_in_fan_out else delta


NF4_MODULE = "torchao.quantization.quantize_.workflows.nf4.nf4_tensor"
"""Where torchao keeps ``NF4Tensor``, the 4-bit weight of a ``model.quantize=nf4`` base."""


def is_nf4(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is torchao's NF4Tensor (False whenever torchao was never loaded)."""
    module = sys.modules.get(NF4_MODULE)
    return module is not None and isinstance(tensor, module.NF4Tensor)


def dense(weight: torch.Tensor) -> torch.Tensor:
    """A base weight as a plain tensor: a 4-bit NF4 one dequantized to the dtype it computes
    in (the values the run trains against), any other as it is. For arithmetic on ``W0``
    itself (DoRA's norm), which an NF4 tensor does not support."""
    return weight.get_original_weight().to(weight.dtype) if is_nf4(weight) else weight


def optional_dropout(p: float) -> nn.Module:
    """Dropout when p > 0; an identity (no RNG use, no copy) otherwise."""
    return nn.Dropout(p) if p > 0 else nn.Identity()


def adapter_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Every adapter module in the model, with its module path, in model order."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, AdapterModule)]


def head_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Parameters outside the pretrained backbone (``model.base_model``): the task head.

    Found by module identity, so tied weights (BART's lm_head = shared embeddings) are not
    counted as head. A language model's output embeddings (an untied ``lm_head``, as in
    Llama or Qwen) are pretrained, not a new task head: they stay frozen, as in PEFT."""
    base = getattr(model, "base_model", model)
    if base is model:
        return []
    in_base = {id(p) for p in base.parameters()}
    get_head = getattr(model, "get_output_embeddings", None)
    lm_head = get_head() if callable(get_head) else None
    if lm_head is not None:
        in_base |= {id(p) for p in lm_head.parameters()}
    seen: set[int] = set()
    out = []
    for p in model.parameters():
        if id(p) not in in_base and id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def count(params: list[nn.Parameter]) -> int:
    return sum(p.numel() for p in params)


class RankController(Protocol):
    """What decides a method's ranks while it trains (AdaLoRA's and prune-LoRA's
    allocator, SoRA's gates, IncreLoRA's growth): the run checkpoints its state, writes its
    final pattern to the run directory and counts the kept parameters as "# Params"."""

    @property
    def mask(self) -> torch.Tensor:
        """Flat 0/1 tensor of the ranks kept now; compared across processes."""
        ...

    def step(self, t: int, scored: bool = True, grad_scale: float = 1.0
             ) -> StepReport | None:
        """After optimizer step t; ``scored=False``: the fp16 loss scaler skipped it, and
        nothing about it may enter the controller's scores. ``grad_scale``: the factor the
        fp16 loss scaler multiplied this step's backward by (1.0 without one); the
        parameters' gradients are unscaled already, gradients a controller collected
        itself (IncreLoRA's dL/dDelta W) are not."""
        ...

    def rank_pattern(self) -> dict[str, int]: ...

    def final_adapter_params(self) -> int: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class ParamGroup:
    """Parameters the optimizer treats alike: their learning rate is ``lr_scale`` times
    ``train.learning_rate`` (every schedule multiplies it the same way), with or without
    ``train.weight_decay``."""

    params: list[nn.Parameter]
    lr_scale: float = 1.0
    weight_decay: bool = True


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
    """Unweighted regularizer R (logged under ``reg_name``)."""
    reg_name: str = "orth_reg"
    """The name the regularizer is logged under in metrics.jsonl (SoRA's is ``gate_l1``)."""
    after_step: Callable[..., StepReport | None] | None = None
    """Called with the optimizer step t (from 1) after optimizer.step() and before
    zero_grad(), with ``scored=False`` for a step the fp16 loss scaler skipped and
    ``grad_scale`` (the loss scale of the step's backward) for one it applied; returns
    values to log, e.g. {"budget": b_t} and, at mask events,
    {"ranks": {module path: rank}}."""
    allocator: RankController | None = None
    """What decides the ranks while training (AdaLoRA's or prune-LoRA's allocator, SoRA's
    gates, IncreLoRA's growth); its state is checkpointed and its final pattern written to
    the run directory. None for the fixed-rank methods and in a dry run."""
    layers: list[tuple[str, nn.Module]] = field(default_factory=list)
    """The injected adapter modules by module path (empty for BitFit and full)."""
    groups: list[ParamGroup] | None = None
    """How the optimizer splits ``trainable`` (LoRA+'s faster B, SoRA's gates without
    weight decay); the first group trains at ``train.learning_rate``, the rate the run logs.
    None: one group of every trainable parameter."""
    kept: list[nn.Parameter] = field(default_factory=list)
    """Frozen tensors the method derived when it was built and its forward depends on,
    which a rebuild could not recompute exactly (PiSSA's principal factors, IncreLoRA's
    ranks); saved and restored with the trainable ones."""
    rank_pattern: dict[str, int] | None = None
    """The ranks fixed when the method was built, ``{module path: rank}`` (LoRA on a
    finished AdaLoRA run's ranks): written to the run directory as a rank controller's
    final pattern is. None where a controller decides them, or every matrix has one rank."""
    settled: dict[str, Any] = field(default_factory=dict)
    """Config values the build settled (``{"lora.rank_pattern_sha256": ...}``), for the run
    directory's config.yaml to record."""
    adapter_count: int | None = None
    """The adapter parameters at the method's initial size, when not every entry of
    ``adapter`` is a parameter of the method yet (IncreLoRA allocates room for the ranks it
    will grow; what it keeps at the end is its allocator's ``final_adapter_params``)."""
    calibration: Any = None
    """A pass over the first training batches before the optimizer is built, which sets
    each adapted module's rank and initial factors (EVA;
    :class:`~adalora_cli.engine.calibration.CalibrationPass`); None: no pass."""

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
        return self.adapter_count if self.adapter_count is not None else count(self.adapter)

    @property
    def trainable_params(self) -> int:
        """What the optimizer trains at the method's initial size: every trainable entry
        less the room held for ranks not grown yet, so :attr:`adapter_params` plus
        :attr:`head_params` (the two never share a parameter)."""
        room = count(self.adapter) - self.adapter_params
        return count(self.trainable) - room

    def optimizer_groups(self, lr: float, weight_decay: float) -> list[dict[str, Any]]:
        """``torch.optim`` parameter groups: :attr:`groups`, or all of ``trainable`` at
        ``lr``. Every trainable parameter is in exactly one group."""
        if self.groups is None:
            return [{"params": self.trainable, "lr": lr, "weight_decay": weight_decay}]
        grouped = [id(p) for g in self.groups for p in g.params]
        if sorted(grouped) != sorted(id(p) for p in self.trainable):
            raise ValueError(f"{self.name}: the parameter groups must hold every trainable "
                             "parameter exactly once")
        if not (self.groups[0].params and self.groups[0].lr_scale == 1.0):
            raise ValueError(f"{self.name}: the first parameter group must train at the "
                             "configured learning rate (the one the run logs)")
        return [{"params": list(g.params), "lr": lr * g.lr_scale,
                 "weight_decay": weight_decay if g.weight_decay else 0.0}
                for g in self.groups if g.params]

    @property
    def head_params(self) -> int:
        return count(self.head)
