"""BitFit (Zaken et al., 2022): train every bias term of the backbone, plus the task head
(docs/maths.md#methods); :func:`build_bitfit` is its builder.

Biases are found as the ``bias`` attribute of each module (``nn.Linear``, ``nn.LayerNorm``,
...), so a bias is recognised by what it is, not by parsing parameter names.
"""

from __future__ import annotations

from torch import nn

from ..config import RunConfig
from .base import MethodHandle, head_parameters
from .building import without_head


def bias_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Every bias parameter of ``model``, once each, in module order."""
    seen: set[int] = set()
    out = []
    for module in model.modules():
        bias = getattr(module, "bias", None)
        if isinstance(bias, nn.Parameter) and id(bias) not in seen:
            seen.add(id(bias))
            out.append(bias)
    return out


def build_bitfit(model: nn.Module, cfg: RunConfig, total_steps: int | None) -> MethodHandle:
    head = head_parameters(model)
    return MethodHandle(name="bitfit", adapter=without_head(bias_parameters(model), head),
                        head=head)
