"""One run on many processes (torchrun / ``torch.distributed``); a no-op on one process.

``train.batch_size`` is the global batch: every optimizer step sees the same examples in
the same order whatever the number of processes, and each rank takes its slice of each
global micro-batch. Each rank's loss is weighted by its share of the micro-batch, so the
gradient DDP averages over ranks is the gradient of the global mean, as on one process.
Only rank 0 writes (run directory, checkpoints, trackers, progress) and evaluates; the
others wait for it. The rank allocator runs on every rank from the all-reduced gradients,
but the masks are rank 0's: each rank's importance scores may differ in their last bits
(CUDA's ``index_add_`` and other reductions add in no fixed order), and two triplets whose
scores are that close could otherwise be ranked differently on two ranks. Rank 0 chooses
and broadcasts (:func:`masks_from_rank0`); a cheap checksum after every mask event
(:func:`check_masks`) guards the construction. With ``train.sharding=fsdp`` the model is
sharded instead of wrapped in DDP (``sharding.py``): each rank scores its own rows and the
triplet scores are summed over the ranks, and rank 0's choice is broadcast just the same;
the batches, the weighting and rank 0's role stay as described here.
"""

from __future__ import annotations

import datetime
import gc
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ..config import ConfigError
from ..errors import RankDied
from ..rundir.run import resume_command

TIMEOUT = datetime.timedelta(hours=int(os.environ.get("ADALORA_DIST_TIMEOUT_HOURS", "6")))
"""How long ranks wait for each other, e.g. while rank 0 evaluates a large split."""


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


def world() -> World:
    """This process's place, from the variables torchrun sets (one process without them)."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    return World(int(os.environ.get("RANK", "0")), size, int(os.environ.get("LOCAL_RANK", "0")))


def init(w: World, device_type: str) -> None:
    """Join the process group (NCCL on CUDA, gloo on CPU) when there are several ranks."""
    if w.distributed and not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=TIMEOUT)


def shutdown() -> None:
    """Leave the process group, if still in it (every exit; a finished run has left it in
    :func:`leave_together`)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def per_rank_batch(batch_size: int, w: World) -> int:
    if batch_size % w.size:
        raise ConfigError(f"train.batch_size={batch_size} is the global batch and must divide "
                          f"by the {w.size} processes; use a multiple of {w.size}")
    return batch_size // w.size


def shard(indices: list[int], w: World) -> tuple[list[int], float]:
    """This rank's slice of a global micro-batch and the weight of its mean loss.

    Slices differ by at most one example; a rank left with none (a last batch smaller than
    the world) runs the batch's first example with weight 0, so every rank still takes part
    in the gradient all-reduce."""
    n = len(indices)
    lo, hi = (w.rank * n) // w.size, ((w.rank + 1) * n) // w.size
    if hi == lo:
        return indices[:1], 0.0
    # DDP averages over ranks: rank r's mean loss times n_r * size / n sums to the global mean
    return indices[lo:hi], (hi - lo) * w.size / n


def _reduce_device() -> torch.device:
    """Where the backend can reduce a tensor: NCCL needs CUDA tensors, gloo takes CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _tensor(values: list[float], dtype=torch.float64) -> torch.Tensor:
    """``values`` as a tensor the backend can reduce."""
    return torch.tensor(values, dtype=dtype, device=_reduce_device())


def broadcast(value: Any, w: World) -> Any:
    """Rank 0's ``value`` on every rank."""
    if not w.distributed:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather(value: Any, w: World) -> list[Any]:
    """Every rank's ``value``, in rank order, on every rank (``[value]`` on one process)."""
    if not w.distributed:
        return [value]
    box: list[Any] = [None] * w.size
    dist.all_gather_object(box, value)
    return box


def any_rank(flag: bool, w: World) -> bool:
    """True on every rank if it is true on any (a stop signal seen by one rank)."""
    if not w.distributed:
        return flag
    t = _tensor([1.0 if flag else 0.0])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def global_mean(value: torch.Tensor, weight: float, w: World) -> torch.Tensor:
    """The micro-batch's mean loss over all ranks (each rank's mean times its weight), a
    float64 0-d tensor; the all-reduce is queued, nothing waits for it here."""
    if not w.distributed:
        return value
    t = (value.double() * weight).reshape(1).to(_reduce_device())
    dist.all_reduce(t)
    return t[0] / w.size


def masks_from_rank0(allocator: Any, w: World) -> None:
    """Make every mask the rank allocator chooses rank 0's choice, broadcast to the other
    ranks (they all reach each mask event at the same step ``t``); a no-op on one process
    or without an allocator."""
    if not w.distributed or allocator is None:
        return

    def agree(keep: torch.Tensor) -> torch.Tensor:
        dist.broadcast(keep, src=0)  # on the mask's device: a CUDA tensor under NCCL
        return keep

    allocator.agree = agree


def check_masks(mask: torch.Tensor, step: int, w: World) -> None:
    """Fail loudly if the allocator's mask differs between ranks (it cannot, once
    :func:`masks_from_rank0` is in place: a guard)."""
    if not w.distributed:
        return
    m = mask.detach().double().cpu()
    weights = torch.arange(1, m.numel() + 1, dtype=torch.float64)
    mine = _tensor([float((m * weights).sum()), float(m.sum())])
    every = [torch.zeros_like(mine) for _ in range(w.size)]
    dist.all_gather(every, mine)
    every = [t.cpu() for t in every]
    if any(not torch.equal(every[0], other) for other in every[1:]):
        sums = ", ".join(f"rank {r}: {int(t[1])} kept / checksum {t[0]:.0f}"
                         for r, t in enumerate(every))
        raise RuntimeError(f"AdaLoRA masks diverged across processes at step {step} ({sums})")


def barrier(w: World) -> None:
    if w.distributed:
        dist.barrier()


def leave_together(w: World) -> None:
    """Wait, at the end of a finished run, until every rank is done before any tears its
    process group down (rank 0 still writes the run's outputs when the others finish).

    A finished two-rank FSDP run on gloo had a rank abort at interpreter exit, after all
    its Python code ("terminate called without an active exception", no Python frame) in
    3 of 22 runs on 2026-11-26; 1 of 30 with this wait alone, 0 of 90 with the wait and
    then the group's garbage (reference cycles) collected here, while the interpreter is
    whole. Only a finished run does this: on a failure, collecting that garbage beside a
    dead peer prints gloo's complaints before the one error line. A peer gone meanwhile:
    rank 0 has written the whole run by now, so it leaves as it would have without the
    wait (the launcher names the dead rank); another rank says it, as a RankDied (rank 0
    may have died writing)."""
    if not w.distributed:
        return
    try:
        dist.barrier()
    except RuntimeError as err:
        died = rank_died(err, w)
        if died is None:
            raise
        if not w.main:
            raise died from None
        return  # the finally's shutdown() leaves the group; no collection beside a dead peer
    dist.destroy_process_group()
    gc.collect()


_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
              "remote process exited", "NCCL communicator was aborted")
"""What gloo and NCCL say when the process at the other end of a collective is gone."""


def rank_died(err: BaseException, w: World, run_dir: Any = None) -> RankDied | None:
    """``err`` as a :class:`RankDied` when it is a collective failing because another rank
    died; None for any other error."""
    if not w.distributed or not isinstance(err, RuntimeError):
        return None
    text = str(err)
    if not any(marker in text for marker in _PEER_GONE):
        return None
    cause = next(m for m in _PEER_GONE if m in text)
    return RankDied(f"another process of this {w.size}-process run died ({cause}), so rank "
                    f"{w.rank} stopped too; that process's own output (or the kernel log, "
                    "for the out-of-memory killer) says why"
                    + (f"; {resume_command(run_dir, w.size)} continues the run"
                       if run_dir is not None else ""))
