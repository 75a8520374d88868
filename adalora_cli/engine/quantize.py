"""A 4-bit frozen base (``model.quantize=nf4``): QLoRA's NormalFloat through torchao.

QLoRA (Dettmers et al., 2023) stores each frozen weight as 4-bit NormalFloat codes in blocks
of 64 values, each block's absmax scale quantized again to 8 bits in blocks of 256 scales
(double quantization), and dequantizes to the compute dtype in every forward; only the
adapters train, in their own dtype. torchao's ``NF4Tensor`` is that format in pure PyTorch
(CPU and CUDA), as torchtune's QLoRA uses it. An ``nn.Linear`` whose weight is an
``NF4Tensor`` computes ``F.linear`` through torchao's ``linear_nf4`` (dequantize, then an
ordinary matmul; its backward never forms a weight gradient), so the adapters, which call
the layer they wrap, need no change.

Which layers: every ``nn.Linear`` of the backbone (``model.base_model``) that no method
trains, the matrices the adapters wrap and those they leave alone. Embeddings, norms, the
task head and a language model's output layer keep ``model.base_dtype``, as in QLoRA. A
weight must split into 64-value blocks; its scales are grouped 256 to a block where their
number allows, else in the largest group under 256 that divides it (SmolLM2-135M's 576 x 576
matrices have 5,184 scales: groups of 216). A weight that does not split into 64-value blocks
(the test models' 37-wide FFN) or a GPT-2 ``Conv1D`` stays in ``model.base_dtype``, and the
run says how many did.

torchao is imported only when a run asks for NF4 (the ``qlora`` extra).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ..config import ConfigError, RunConfig
from ..methods.base import LINEAR_TYPES, NF4_MODULE, dense, is_nf4
from ..tasks import gguf

BLOCK = 64
"""Values per NF4 block, each with its own absmax scale (QLoRA's block size)."""
SCALER_BLOCK = 256
"""Scales per block of the second quantization (QLoRA's and torchao's)."""
INSTALL_HINT = "pip install -e '.[qlora]' (or make install)"
UNQUANTIZED_GGUF = {0: "F32", 1: "F16", 28: "F64", 30: "BF16"}
"""GGML tensor types that hold plain floats: a GGUF base of only these can become NF4."""


def _nf4():
    """torchao's NF4 module; a missing torchao is a one-line ConfigError naming the extra."""
    import importlib
    import logging

    # torchao announces at import every optional CUDA kernel this build cannot load (none
    # of them is NF4's): keep that off the run's output. torch warns of a deprecation in
    # how torchao registers its enums, at import and again when transformers later loads
    # more of torchao: that logger stays quiet for the process
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    quiet = logging.getLogger("torchao")
    level = quiet.level
    try:
        quiet.setLevel(logging.ERROR)
        return importlib.import_module(NF4_MODULE)
    except ImportError as err:
        raise ConfigError(f"model.quantize=nf4 needs torchao ({err}); install it with "
                          f"{INSTALL_HINT}, or set model.quantize=none") from None
    finally:
        quiet.setLevel(level)


def check(cfg: RunConfig, trains_base: bool, path: str) -> None:
    """Refuse, before anything loads, what NF4 cannot do: a method that trains the base
    weights themselves, and a GGUF base (``path``, resolved) already quantized in its own
    format, which NF4 would round a second time."""
    if cfg.model.quantize == "none":
        return
    if trains_base:
        raise ConfigError(f"model.quantize=nf4 freezes the base in 4 bits, but method "
                          f"{cfg.method.name} trains the base weights themselves; use a "
                          "method that keeps the base frozen (adalora, lora, ...) or "
                          "model.quantize=none")
    if cfg.train.sharding != "none":
        # torchao shards an NF4 tensor's codes, scales and factors along with its rows, so
        # each must split evenly across the processes; untried here beyond a tiny model
        # whose single scale block does not (it failed at the first step)
        raise ConfigError("model.quantize=nf4 does not run with train.sharding=fsdp yet; "
                          "set train.sharding=none (--nproc without sharding trains on an "
                          "NF4 base) or model.quantize=none")
    if gguf.is_gguf(path):
        types = gguf.tensor_types(path)
        quantized = sorted(name for code, name in types.items() if code not in UNQUANTIZED_GGUF)
        if quantized:
            raise ConfigError(f"model.quantize=nf4 on GGUF file {path}, whose weights are "
                              f"already quantized ({', '.join(quantized)}): NF4 would round "
                              "them again; use its F16/BF16/F32 GGUF or the checkpoint "
                              "folder, or model.quantize=none")
    _nf4()  # torchao is there: say so now, not after the model has loaded


@dataclass
class Quantized:
    """What :func:`quantize_base` did."""

    layers: int = 0
    """Linear layers whose weight is now NF4."""
    kept: list[str] = field(default_factory=list)
    """Frozen backbone linears left in their dtype (no 64-value blocks, or a Conv1D)."""

    def note(self, dtype: torch.dtype) -> str | None:
        """One line for stderr when some frozen linears could not become NF4."""
        if not self.kept:
            return None
        name = str(dtype).removeprefix("torch.")
        return (f"note: model.quantize=nf4 stored {self.layers} linear layers in NF4; "
                f"{len(self.kept)} stay in {name} (a weight that does not split into "
                f"{BLOCK}-value blocks, or GPT-2's Conv1D), e.g. {self.kept[0]}")


def scaler_block(n_blocks: int) -> int:
    """Scales per block of the second quantization: 256, or the largest divisor of
    ``n_blocks`` under it (torchao needs the scales to fill whole blocks)."""
    return next(d for d in range(min(SCALER_BLOCK, n_blocks), 0, -1) if n_blocks % d == 0)


def frozen_linears(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Every linear layer of the backbone no method trains, by path from the model root:
    not the task head, not a language model's output layer, not an adapter's own."""
    backbone = getattr(model, "base_model", model)
    inside = {id(m) for m in backbone.modules()}
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    return [(path, m) for path, m in model.named_modules()
            if isinstance(m, LINEAR_TYPES) and id(m) in inside and m is not head
            and not m.weight.requires_grad]


@torch.no_grad()
def quantize_base(model: nn.Module) -> Quantized:
    """Make each frozen backbone linear's weight an NF4Tensor of the weight in its current
    dtype (the dtype it will be dequantized to); in place."""
    to_nf4 = _nf4().to_nf4
    done = Quantized()
    for path, layer in frozen_linears(model):
        w = layer.weight
        if is_nf4(w):
            continue
        if type(layer) is not nn.Linear or w.numel() % BLOCK:
            done.kept.append(path)
            continue
        n_blocks = w.numel() // BLOCK
        layer.weight = nn.Parameter(to_nf4(w.detach().contiguous(), BLOCK,
                                           scaler_block(n_blocks)), requires_grad=False)
        done.layers += 1
    return done


@torch.no_grad()
def dequantize(layer: nn.Module) -> None:
    """Give an NF4 layer back a plain weight in the dtype it computed in (the dequantized
    values the run trained against); a layer without one is left alone."""
    if is_nf4(layer.weight):
        layer.weight = nn.Parameter(dense(layer.weight), requires_grad=False)
