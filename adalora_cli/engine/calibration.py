"""The pass some methods make before training: the first training batches run through the
frozen model, and the method reads what it needs from them (EVA: the inputs of each adapted
layer; a gradient-based method: the gradients of the frozen weights), then sets each adapted
module's rank and initial factors. Only then is the optimizer built.

A method asks for a pass by putting a :class:`CalibrationPass` on its
:class:`~adalora_cli.methods.base.MethodHandle` (``handle.calibration``) and by naming, in its
registry entry, the config key that says how many batches the pass reads
(``MethodSpec.pass_batches``); the build refuses a count the training data cannot give
(``engine/build.py``'s ``check_batches``), before anything is written.

The pass sees exactly what training will see first: the run's own seeded order (a
generator seeded with ``train.seed``, drawn the way the training loader draws its first
epoch, so the training order itself is left untouched), on the run's device, under its
autocast, each global batch split as ``train.length_split`` splits it. Under DDP each process
sees its slice of each batch; :class:`Collective` is how a method reduces its statistics
across processes (``sum``: an all-reduce; ``cat``: every process's rows, in rank order), so
that every process chooses the same ranks. On one process both return their input.
A process whose share of a short last batch is a stand-in example (weight 0,
``distributed.shard``) runs no forward of it in a forward-only pass; a method still makes
the same reductions on every process, with no rows of its own where it saw none.

A resumed run does not pass again: its ranks are the shapes its checkpoint holds
(:meth:`CalibrationPass.restore`), and the checkpoint's tensors are loaded into them.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

from ..config import RunConfig
from .distributed import World, any_rank
from .order import EpochBatches, example_lengths
from .split import LengthSplit

if TYPE_CHECKING:
    from ..methods.base import MethodHandle
    from .build import Built


class Collective:
    """Reductions across the processes of a run; on one process each returns its input."""

    def __init__(self, w: World):
        self.w = w

    def _device(self) -> torch.device:
        return (torch.device("cuda", torch.cuda.current_device())
                if dist.get_backend() == "nccl" else torch.device("cpu"))

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` summed over the processes (a new tensor, on ``t``'s device)."""
        if not self.w.distributed:
            return t
        out = t.detach().to(self._device()).clone()
        dist.all_reduce(out)
        return out.to(t.device)

    def cat(self, t: torch.Tensor) -> torch.Tensor:
        """Every process's rows of ``t`` (shape ``(n_k, ...)``, ``n_k`` may differ), in rank
        order along dim 0."""
        if not self.w.distributed:
            return t
        device = self._device()
        local = t.detach().to(device)
        sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(self.w.size)]
        dist.all_gather(sizes, torch.tensor([local.shape[0]], device=device))
        rows = [int(s.item()) for s in sizes]
        padded = local.new_zeros((max(rows), *local.shape[1:]))
        padded[:local.shape[0]] = local
        parts = [torch.zeros_like(padded) for _ in range(self.w.size)]
        dist.all_gather(parts, padded.contiguous())
        return torch.cat([p[:n] for p, n in zip(parts, rows)]).to(t.device)


class CalibrationPass(Protocol):
    """What a method's pass does; the engine feeds it batches (:func:`calibrate`)."""

    title: str
    """What the pass does, in a few words (the progress line's name)."""
    n_batches: int | None
    """The most batches it reads (None: up to one epoch); it may stop earlier."""
    needs_grad: bool
    """True: each batch also runs the loss's backward (the pass reads gradients; it makes
    the frozen weights it wants gradients of require them in :meth:`begin`)."""

    def begin(self, model: nn.Module, collective: Collective) -> None:
        """Before the first batch: attach hooks."""
        ...

    def inputs(self, batch: dict[str, torch.Tensor]) -> None:
        """The model inputs of the piece about to run forward (e.g. its attention mask)."""
        ...

    def observe(self) -> bool:
        """After each global batch; True: the pass has what it needs and stops."""
        ...

    def end(self, model: nn.Module) -> dict[str, int]:
        """After the last batch: remove hooks, reduce, set every adapted module's rank and
        initial factors; returns the rank of each adapted module by path."""
        ...

    def restore(self, shapes: dict[str, torch.Size]) -> dict[str, int]:
        """A resumed run: give every adapted module the rank its checkpoint's tensors (by
        parameter name) hold; returns the ranks as :meth:`end` does."""
        ...

    def summary(self) -> str:
        """One line on what the pass found (printed after it)."""
        ...


def epoch_batches(data: Any, cfg: RunConfig) -> int:
    """Batches of ``train.batch_size`` in one epoch of the training split."""
    return math.ceil(len(data) / cfg.train.batch_size)


def _order(built: Built, w: World) -> DataLoader:
    """The run's first epoch as its training loader will draw it (same generator seed, same
    sampler, the same DataLoader consumption of the generator), pieces and all."""
    t_cfg, data = built.cfg.train, built.data
    generator = torch.Generator().manual_seed(t_cfg.seed)
    lengths = example_lengths(data.train) if t_cfg.group_by_length else None
    batches = EpochBatches(data.train, t_cfg.batch_size, generator, lengths, world=w)
    return DataLoader(data.train, batch_sampler=batches, generator=generator,
                      collate_fn=LengthSplit(data.collate, t_cfg.length_split))


def calibrate(built: Built, w: World, quiet: bool,
              latest_tensors: dict[str, torch.Tensor] | None = None) -> float:
    """Run the method's pass (if it has one) on ``built.model``, already on its device, and
    settle the handle: the adapted modules at their chosen ranks, their parameters the ones
    the optimizer will train. ``latest_tensors``: a resumed run's checkpoint, whose shapes
    give the ranks instead of a new pass. Returns the seconds the pass took (0 without
    one), which the run counts in its training time."""
    handle = built.handle
    cal = handle.calibration
    if cal is None:
        return 0.0
    began = time.perf_counter()
    if latest_tensors is not None:
        ranks = cal.restore({k: v.shape for k, v in latest_tensors.items()})
    else:
        ranks = _run(cal, built, w, quiet)
    settle(handle, ranks, built.device)
    if not quiet:
        print(cal.summary(), flush=True)
    return time.perf_counter() - began


def _run(cal: CalibrationPass, built: Built, w: World, quiet: bool) -> dict[str, int]:
    from .progress import PhaseLines, phase_seconds

    model, device = built.model, built.device
    loader = _order(built, w)
    total = len(loader) if cal.n_batches is None else min(cal.n_batches, len(loader))
    lines = PhaseLines(0.0 if quiet else phase_seconds())
    lines.begin(f"{cal.title}: up to {total} batches before training", show=not quiet)
    autocast = built.precision.context()
    was_training = model.training
    model.eval()  # no dropout: the statistics are the frozen model's
    cal.begin(model, Collective(w))
    try:
        with lines.watching():
            for k, pieces in enumerate(loader):
                if k >= total:
                    break
                weight = loader.batch_sampler.weight
                for batch, share in pieces:
                    if weight == 0 and not cal.needs_grad:
                        break  # a stand-in example (distributed.shard): nothing to see
                    batch = {key: v.to(device) for key, v in batch.items()}
                    cal.inputs(batch)
                    if cal.needs_grad:
                        with autocast():
                            loss = model(**batch).loss
                        (loss * (weight * share)).backward()
                    else:
                        with torch.no_grad(), autocast():
                            model(**batch)
                lines.report("batch", k + 1, total)
                # every process stops at the same batch, whatever one of them decided
                if any_rank(cal.observe(), w):
                    break
        return cal.end(model)
    finally:
        lines.end()
        model.zero_grad(set_to_none=True)
        model.train(was_training)


def settle(handle: MethodHandle, ranks: dict[str, int], device: torch.device) -> None:
    """After the pass: the handle trains the adapted modules' parameters as they are now
    (fp32, requiring gradients), and remembers the ranks for the run directory."""
    from ..methods.building import adapter_params

    adapter = adapter_params(handle.layers)
    for p in adapter:
        if p.is_floating_point() and p.dtype != torch.float32:
            p.data = p.data.float()
        p.requires_grad_(True)
    handle.adapter = adapter
    handle.rank_pattern = dict(ranks)
