"""Bottleneck adapters: Houlsby (Houlsby et al., 2019; the paper's HAdapter) and Pfeiffer
(Pfeiffer et al., 2021; PAdapter), with their builders :func:`build_houlsby` and
:func:`build_pfeiffer`.

An adapter wraps an output projection: ``y = base(x); out = y + up(dropout(act(down(y))))``,
so it sits after the projection and before that sublayer's residual add and LayerNorm
(docs/maths.md#methods). ``down`` starts at N(0, 0.02) with a zero bias and ``up`` at zero, so
the adapted model computes exactly what the pretrained one does at step 0. Houlsby puts one
after the attention output and one after the FFN output of every layer (SiLU); Pfeiffer only
after the FFN output (ReLU). Where they attach per model type lives in ``inject.py``.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from ..config import RunConfig
from .base import LinearWrapper, MethodHandle, head_parameters, optional_dropout
from .building import adapter_params
from .inject import adapter_sites, replace_linears


class BottleneckAdapter(LinearWrapper):
    """``y + up(dropout(act(down(y))))`` with ``y = base(x)``; d_model -> dim -> d_model."""

    activation: type[nn.Module] = nn.ReLU

    def __init__(self, base: nn.Module, dim: int, dropout: float = 0.0):
        super().__init__(base)
        w = base.weight
        d_model = self.out_features  # the adapter sees the projection's output
        kw = {"device": w.device, "dtype": torch.float32}  # trained: fp32 whatever the base
        self.down = nn.Linear(d_model, dim, **kw)  # weight (dim, d_model)
        self.up = nn.Linear(dim, d_model, **kw)  # weight (d_model, dim)
        self.act = self.activation()
        self.dropout = optional_dropout(dropout)
        with torch.no_grad():
            self.down.weight.normal_(0.0, 0.02)
            self.down.bias.zero_()
            self.up.weight.zero_()  # the adapter starts as the identity map
            self.up.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        return y + self.up(self.dropout(self.act(self.down(y))))

    def adapter_parameters(self) -> Iterator[nn.Parameter]:
        yield from (*self.down.parameters(), *self.up.parameters())


class HoulsbyAdapter(BottleneckAdapter):
    """Two per layer (attention and FFN outputs), SiLU."""

    activation = nn.SiLU


class PfeifferAdapter(BottleneckAdapter):
    """One per layer (FFN output), ReLU."""

    activation = nn.ReLU


def bottleneck(model: nn.Module, cfg: RunConfig, kind: type[nn.Module], *,
               attention: bool) -> MethodHandle:
    ad = cfg.adapter
    sites = adapter_sites(model, attention=attention)
    layers = replace_linears(model, sites, lambda lin: kind(lin, ad.dim, ad.dropout))
    return MethodHandle(name=cfg.method.name, adapter=adapter_params(layers),
                        head=head_parameters(model), layers=layers)


def build_houlsby(model: nn.Module, cfg: RunConfig, total_steps: int | None) -> MethodHandle:
    return bottleneck(model, cfg, HoulsbyAdapter, attention=True)  # attention + FFN


def build_pfeiffer(model: nn.Module, cfg: RunConfig, total_steps: int | None) -> MethodHandle:
    return bottleneck(model, cfg, PfeifferAdapter, attention=False)  # FFN only
