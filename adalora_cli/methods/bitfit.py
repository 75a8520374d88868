"""BitFit (Zaken et al., 2022): train every bias term of the backbone, plus the task head.

Biases are found as the ``bias`` attribute of each module (``nn.Linear``, ``nn.LayerNorm``,
...), so a bias is recognised by what it is, not by parsing parameter names.
"""

from __future__ import annotations

from torch import nn


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
