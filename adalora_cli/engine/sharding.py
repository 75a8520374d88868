"""``train.sharding=fsdp``: the model sharded across the processes with torch's FSDP2.

DDP (``train.sharding=none``) keeps a whole model on every process. Here every transformer
block, and then the rest of the model (the root), is handed to ``fully_shard`` on a
one-dimensional device mesh over all processes (CPU + gloo, or CUDA + NCCL): each process
stores only its rows of every parameter, frozen or trained, and of the optimizer state; a
block's whole weights exist only while it runs. Gradients are averaged over the processes
as under DDP, so the loss weighting of ``distributed.shard`` gives the one-process gradient.

What looks at whole matrices is told where the rows are (``methods/placement.py``): the
rank allocator keeps its averages for the rows held here and adds its per-triplet sums up
over the processes (in rank order, so every process gets the same bits and picks the same
top-b), and the orthogonal regularizer gathers the small adapter factors whole, so its
value and gradient are the unsharded ones.

Only rank 0 reads the pretrained weights: the other processes build the model's shapes on
the meta device (:func:`lean`), and :func:`shard` sends each of them its rows of rank 0's
weights, so no process but rank 0 ever holds the whole model, and rank 0 only until it is
sharded.

Mixed precision follows ``train.precision``: bf16 computes with bf16 copies of the
weights while the sharded parameters the optimizer updates, its state and the gradient
reduction stay fp32; fp32 changes nothing. fp16's loss scaler is not sharding-aware and is
refused, as are one process, a method that saves the whole model or is not shardable
(the registry's ``shardable``: today's baselines), and a model without transformer blocks to
shard (:func:`check`, :func:`find_blocks`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from ..config import ConfigError, RunConfig
from ..methods.base import MethodHandle
from ..methods.registry import method_spec
from .distributed import World

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from .precision import Precision

_NONE_HINT = "or set train.sharding=none (each process then holds the whole model)"


def enabled(cfg: RunConfig) -> bool:
    return cfg.train.sharding == "fsdp"


def lean(cfg: RunConfig, w: World | None) -> bool:
    """Whether this process builds the model without its weights (on the meta device):
    every rank but 0 of a sharded run, which receives its rows from rank 0 instead."""
    return enabled(cfg) and w is not None and w.distributed and not w.main


def check(cfg: RunConfig, w: World, precision: Precision) -> None:
    """Refuse what FSDP cannot run, before the model is loaded; one line each."""
    device = precision.device
    if not enabled(cfg):
        return
    if not w.distributed:
        raise ConfigError("train.sharding=fsdp shards the model across processes, but this "
                          "run has one: start it with --nproc N (N >= 2) or torchrun, "
                          + _NONE_HINT)
    if method_spec(cfg.method.name).saves_whole_model:
        raise ConfigError(f"method.name={cfg.method.name} trains and saves the whole model, "
                          "which train.sharding=fsdp does not gather; use a parameter-"
                          f"efficient method (adalora, lora, adapters, bitfit) {_NONE_HINT}")
    if not method_spec(cfg.method.name).shardable:
        raise ConfigError(f"method.name={cfg.method.name} does not run sharded yet; use "
                          f"adalora, lora, adapters or bitfit, {_NONE_HINT}")
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"train.sharding=fsdp runs on CUDA or the CPU, not on {device}; set "
                          "train.device=cuda (or cpu), " + _NONE_HINT)
    if precision.loss_scaling and precision.asked == "auto":  # a GPU before Ampere
        raise ConfigError("train.sharding=fsdp does not run fp16 (its loss scaler is not "
                          "sharding-aware), which train.precision=auto picks on a GPU below "
                          "compute capability 8.0: set train.precision=fp32 (or bf16, "
                          "emulated there), " + _NONE_HINT)
    if precision.loss_scaling:
        raise ConfigError("train.sharding=fsdp does not run fp16 (its loss scaler is not "
                          "sharding-aware): set train.precision=bf16 (or fp32), " + _NONE_HINT)


# --------------------------------------------------------------------------- the blocks
def find_blocks(model: nn.Module) -> list[nn.Module]:
    """The model's transformer blocks, each to be sharded on its own, outermost first.

    The classes a Hugging Face model names in ``_no_split_modules`` (Llama's decoder
    layers, BART's encoder and decoder layers, BERT's layers and its embeddings), else the
    members of every ``nn.ModuleList`` whose members are all of one class; a block inside
    another block is not one. None found: a one-line error."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    found = [m for m in model.modules() if type(m).__name__ in names]
    if not found:
        for module in model.modules():
            if isinstance(module, nn.ModuleList) and len(module) > 0 \
                    and len({type(m) for m in module}) == 1 \
                    and any(True for _ in module[0].parameters()):
                found.extend(module)
    inner = {id(sub) for block in found for sub in block.modules() if sub is not block}
    blocks = [b for b in found if id(b) not in inner]
    if not blocks:
        raise ConfigError(f"train.sharding=fsdp found no transformer blocks to shard in "
                          f"{type(model).__name__} (no _no_split_modules, no list of "
                          f"identical layers); {_NONE_HINT}")
    return blocks


# --------------------------------------------------------------------------- sharding
@dataclass
class Sharded:
    """A model sharded in place by :func:`shard`."""

    mesh: DeviceMesh
    placement: FSDPPlacement
    modules: list[nn.Module]
    """Every module given to ``fully_shard``: the blocks, then the root."""


def shard(model: nn.Module, handle: MethodHandle, w: World, device: torch.device,
          amp: torch.dtype | None) -> Sharded:
    """Shard ``model`` in place, every block and then the root, on a mesh of all ``w``'s
    processes, on ``device``; point the method's parameter lists and its allocator and
    regularizer at the sharded parameters. Every process calls it, after the process group
    is up; a :func:`lean` process's rows come from rank 0's whole model."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, (w.size,), mesh_dim_names=("shard",))
    meta = any(p.is_meta for p in model.parameters())
    # Rank 0's weights, where they were loaded (the CPU), to send the others their rows;
    # fully_shard moves each block onto the device as it shards it, so no device ever
    # holds more than its rows and one whole block.
    whole = {} if meta else model.state_dict()
    # bf16: compute with bf16 copies, reduce and keep (the optimizer's) fp32
    policy = MixedPrecisionPolicy(param_dtype=amp, reduce_dtype=torch.float32)
    names = {id(p): name for name, p in model.named_parameters(remove_duplicate=False)}
    blocks = find_blocks(model)
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    modules = [*blocks, model]
    _from_rank0(model, whole, device, meta)
    del whole  # rank 0's whole weights are freed here
    if dist.get_backend(mesh.get_group()) == "gloo":
        # gloo's AVG reduction has summed instead of averaging under FSDP (pytorch issue
        # 162338; right in torch 2.13, tests/engine/test_fsdp_parity.py checks): reduce
        # with SUM and divide by the world size after, which is right on any version.
        for module in modules:
            module.set_force_sum_reduction_for_comms(True)
    now = dict(model.named_parameters(remove_duplicate=False))
    handle.adapter = [now[names[id(p)]] for p in handle.adapter]
    handle.head = [now[names[id(p)]] for p in handle.head]
    placement = FSDPPlacement(mesh.get_group())
    for hook in (handle.allocator, handle.regularizer):  # whatever reads whole matrices
        place = getattr(hook, "place", None)
        if place is not None:
            place(placement)
    return Sharded(mesh, placement, modules)


def _from_rank0(model: nn.Module, whole: dict, device: torch.device, meta: bool) -> None:
    """Every process's rows of rank 0's weights, and rank 0's buffers whole (a buffer left
    out of the state dict, like BERT's position ids, is not sharded but must be there)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if meta:
        model.to_empty(device=device)
    set_model_state_dict(model, whole, options=StateDictOptions(
        full_state_dict=True, broadcast_from_rank0=True))
    for buffer in model.buffers():
        dist.broadcast(buffer, src=0)


@dataclass
class Final:
    """A sharded run's outputs made whole once, at the end, by every process."""

    weights: dict[str, torch.Tensor]
    """The trained tensors by parameter name, whole, on the CPU (as ``trained_state``)."""
    allocator: dict | None
    """The rank allocator's whole state (None without one)."""


@contextlib.contextmanager
def evaluating(model: nn.Module) -> Iterator[None]:
    """Inside: the root's own weights (embeddings, head) stay whole. ``generate()`` calls
    the encoder directly, never the root's forward, whose hook would gather them; the
    blocks gather their own as they run. After: everything is sharded again."""
    model.unshard()
    try:
        yield
    finally:
        reshard(model)


def reshard(model: nn.Module) -> None:
    """Free every whole weight a forward left behind (the root keeps its own after a
    forward, for the backward), so the model's parameters are the sharded ones again:
    what the optimizer, the allocator and a checkpoint hold."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def gather_final(model: nn.Module, handle: MethodHandle) -> Final:
    """Every process: the trained tensors and the allocator state, whole."""
    reshard(model)
    wanted = {id(p) for p in handle.trainable}
    weights: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, p in model.named_parameters():
        if id(p) in wanted and id(p) not in seen:
            seen.add(id(p))
            whole = p.full_tensor() if _sharded(p) else p
            weights[name] = whole.detach().to("cpu").contiguous()
    allocator = handle.allocator.state_dict() if handle.allocator is not None else None
    return Final(weights, allocator)


def model_class(model: nn.Module) -> type:
    """The model's own class: ``fully_shard`` swaps in a subclass named ``FSDP<name>``."""
    from torch.distributed.fsdp import FSDPModule

    cls = type(model)
    while issubclass(cls, FSDPModule) and cls.__bases__:
        cls = cls.__bases__[-1]
    return cls


# --------------------------------------------------------------------------- placement
def _sharded(t: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def _rows(n: int, size: int, rank: int) -> tuple[int, int]:
    """Rank ``rank``'s rows of ``n`` split as ``torch.chunk`` splits them (FSDP2's rule):
    chunks of ceil(n / size) rows in rank order, the last ones shorter or empty."""
    chunk = -(-n // size)
    return min(rank * chunk, n), min((rank + 1) * chunk, n)


@dataclass
class FSDPPlacement:
    """:class:`~adalora_cli.methods.placement.Placement` for parameters sharded on their
    first dimension over ``group`` (FSDP2's ``Shard(0)``)."""

    group: dist.ProcessGroup

    @property
    def size(self) -> int:
        return dist.get_world_size(self.group)

    @property
    def rank(self) -> int:
        return dist.get_rank(self.group)

    def local(self, t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if _sharded(t) else t

    def rows(self, p: torch.Tensor) -> tuple[int, int]:
        if not _sharded(p):
            return 0, p.shape[0]
        lo, hi = _rows(p.shape[0], self.size, self.rank)
        held = p.to_local().shape[0]
        if hi - lo != held:  # FSDP split another way: the scores would be wrong, stop
            raise RuntimeError(f"expected rows {lo}:{hi} of a {tuple(p.shape)} parameter on "
                               f"rank {self.rank}, found {held} rows")
        return lo, hi

    def total(self, x: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        out = parts[0].clone()
        for part in parts[1:]:  # in rank order: the same additions on every process
            out.add_(part)
        return out

    def whole(self, params: list[torch.Tensor]) -> list[torch.Tensor]:
        if not any(_sharded(p) for p in params):
            return params
        shapes = [tuple(p.shape) for p in params]
        return list(_GatherRows.apply(self, shapes, *[self.local(p) for p in params]))


class _GatherRows(torch.autograd.Function):
    """Whole tensors of ``shapes`` from every process's rows, in one ``all_gather``.
    Backward keeps the gradient of this process's rows: every process computed the same
    function of the whole tensors, so that slice is already the full gradient of its rows."""

    @staticmethod
    def forward(ctx, placement: FSDPPlacement, shapes: list[tuple[int, ...]],
                *parts: torch.Tensor):
        size, rank = placement.size, placement.rank
        ctx.spans = [_rows(shape[0], size, rank) for shape in shapes]
        chunks = [-(-shape[0] // size) for shape in shapes]
        widths = [c * math.prod(shape[1:]) for c, shape in zip(chunks, shapes)]
        send = parts[0].new_zeros(sum(widths))
        start = 0
        for part, width in zip(parts, widths):  # each part padded to a whole chunk
            send[start:start + part.numel()].copy_(part.reshape(-1))
            start += width
        got = send.new_empty(size * send.numel())
        dist.all_gather_single(got, send, group=placement.group)
        got = got.view(size, -1)
        out, start = [], 0
        for shape, chunk, width in zip(shapes, chunks, widths):
            rows = got[:, start:start + width].reshape(size * chunk, *shape[1:])
            out.append(rows[:shape[0]].clone())
            start += width
        return tuple(out)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        return (None, None, *[g[lo:hi] for g, (lo, hi) in zip(grads, ctx.spans)])
