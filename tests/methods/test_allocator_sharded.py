"""The rank allocator on rows split across processes (methods/placement.py) takes the masks,
budgets and averages of the allocator on whole matrices.

Two threads stand in for two processes: each holds its own copy of the same layers but
scores and masks only its rows of every ``P``, ``lam``, ``Q`` (or ``B``, ``A``), split as
FSDP splits them (``torch.chunk`` on the first dimension), and its :meth:`total` adds both
threads' partial sums in rank order, as ``engine/sharding.py`` does over processes. The
reference is one allocator on the whole matrices, fed the same gradients.
"""

from __future__ import annotations

import copy
import threading

import pytest
import torch

from adalora_cli.methods.allocator import RankAllocator

from .test_allocator import _layers, _random_grads


class Threads:
    """What two threads share: a barrier and a slot per rank for :meth:`total`."""

    def __init__(self, size: int):
        self.size, self.barrier, self.slots = size, threading.Barrier(size), [None] * size


class RowsPlacement:
    """A thread's rows of every tensor; sums over the threads."""

    def __init__(self, rank: int, shared: Threads):
        self.rank, self.shared = rank, shared

    def rows(self, p: torch.Tensor) -> tuple[int, int]:
        chunks = torch.arange(p.shape[0]).chunk(self.shared.size)  # FSDP's split
        if self.rank >= len(chunks) or chunks[self.rank].numel() == 0:
            return p.shape[0], p.shape[0]  # none of its rows here
        return int(chunks[self.rank][0]), int(chunks[self.rank][-1]) + 1

    def local(self, t: torch.Tensor) -> torch.Tensor:
        lo, hi = self.rows(t)
        return t.narrow(0, lo, hi - lo)  # a view: masking writes into this copy's rows

    def total(self, x: torch.Tensor) -> torch.Tensor:
        shared = self.shared
        shared.slots[self.rank] = x.clone()
        shared.barrier.wait()
        out = shared.slots[0].clone()
        for part in shared.slots[1:]:
            out += part
        shared.barrier.wait()  # nobody overwrites a slot before everyone has read it
        return out

    def whole(self, params: list[torch.Tensor]) -> list[torch.Tensor]:
        return params


def _kept_rows(layers, placement: RowsPlacement) -> dict[str, torch.Tensor]:
    return {f"{name}.{i}": placement.local(p).detach().clone()
            for name, layer in layers for i, p in enumerate(layer.adapter_parameters())}


@pytest.mark.parametrize("kind", ["svd", "lora"])
@pytest.mark.parametrize("size", [2, 3])
def test_split_rows_give_the_whole_masks_and_averages(kind, size):
    """3 splits rows unevenly (d_out 3, r 2, d_in 5 ...), some threads holding none of a
    tensor's rows; the masks and averages must still be the whole allocator's."""
    kw = {"budget": 2, "total_steps": 12, "t_init": 2, "t_final": 3, "delta_t": 2}
    whole_layers = _layers(kind)
    whole = RankAllocator(whole_layers, **kw)
    shared = Threads(size)
    copies = [copy.deepcopy(whole_layers) for _ in range(size)]
    allocators = [RankAllocator(c, **kw) for c in copies]
    placements = [RowsPlacement(r, shared) for r in range(size)]
    for alloc, placement in zip(allocators, placements):
        alloc.place(placement)
    masks, reports, states = [], [[] for _ in range(size)], [None] * size

    def run(rank: int, t: int) -> None:
        reports[rank].append(allocators[rank].step(t))

    for t in range(1, 13):
        for layers in (whole_layers, *copies):
            _random_grads(layers, seed=t)  # every copy sees the averaged gradient
        expected = whole.step(t)
        threads = [threading.Thread(target=run, args=(r, t)) for r in range(size)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert [rep[-1] for rep in reports] == [expected] * size
        masks.append(whole.mask.clone())
        for alloc in allocators:
            assert torch.equal(alloc.mask, whole.mask), t
    assert len({tuple(m.tolist()) for m in masks}) > 2  # the schedule really pruned
    for layers, placement in zip(copies, placements):
        mine, reference = _kept_rows(layers, placement), _kept_rows(whole_layers, placement)
        for name in mine:  # the masked rows of this copy are the whole model's
            torch.testing.assert_close(mine[name], reference[name], rtol=0, atol=0)

    def save(rank: int) -> None:
        states[rank] = allocators[rank].state_dict()

    threads = [threading.Thread(target=save, args=(r,)) for r in range(size)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    reference = whole.state_dict()
    for state in states:  # made whole: the same state whatever the split
        for key in ("I", "I_bar", "U_bar"):
            torch.testing.assert_close(state[key], reference[key], rtol=1e-6, atol=1e-12)
        assert torch.equal(state["mask"], reference["mask"])
    # and a whole state loads into a split allocator as this thread's rows of it
    fresh = RankAllocator(copy.deepcopy(whole_layers), **kw)
    fresh.place(RowsPlacement(size - 1, Threads(size)))
    fresh.load_state_dict(reference)
    lo = [alloc.I_bar for alloc in allocators][size - 1]
    torch.testing.assert_close(fresh.I_bar, lo, rtol=1e-6, atol=1e-12)


class SkewedPlacement(RowsPlacement):
    """Rank 0 sums as :class:`RowsPlacement`; every other thread's sums come out scaled
    entry by entry (a much exaggerated stand-in for reductions that added in another order
    on another GPU), so that thread's own top-b(t) would differ from rank 0's."""

    def total(self, x: torch.Tensor) -> torch.Tensor:
        out = super().total(x)
        if self.rank == 0:
            return out
        self.calls = getattr(self, "calls", 0) + 1
        g = torch.Generator().manual_seed(1000 * self.rank + self.calls)
        return out * torch.rand(out.shape, generator=g).pow(4)


def _from_rank0(rank: int, shared: Threads):
    """What engine/distributed.masks_from_rank0 installs, over threads: rank 0's keep-mask
    broadcast to all."""
    def agree(keep: torch.Tensor) -> torch.Tensor:
        if rank == 0:
            shared.slots[0] = keep.clone()
        shared.barrier.wait()
        out = shared.slots[0].clone()
        shared.barrier.wait()
        return out

    return agree


@pytest.mark.parametrize("broadcast", [True, False])
def test_split_rows_mask_with_rank0s_choice_when_their_sums_disagree(broadcast):
    """Each thread scores its own rows and its sums may differ from rank 0's in the last
    bits: with rank 0's choice broadcast, every thread still masks its rows with the whole
    allocator's mask (rank 0's sums are the whole ones); without it they part ways."""
    kw = {"budget": 2, "total_steps": 12, "t_init": 2, "t_final": 3, "delta_t": 2}
    size = 2
    whole_layers = _layers("svd")
    whole = RankAllocator(whole_layers, **kw)
    shared = Threads(size)
    copies = [copy.deepcopy(whole_layers) for _ in range(size)]
    allocators = [RankAllocator(c, **kw) for c in copies]
    placements = [SkewedPlacement(r, shared) for r in range(size)]
    for rank, (alloc, placement) in enumerate(zip(allocators, placements)):
        alloc.place(placement)
        if broadcast:
            alloc.agree = _from_rank0(rank, shared)
    parted = False
    for t in range(1, 13):
        for layers in (whole_layers, *copies):
            _random_grads(layers, seed=t)
        whole.step(t)
        threads = [threading.Thread(target=allocators[r].step, args=(t,)) for r in range(size)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert torch.equal(allocators[0].mask, whole.mask), t  # rank 0's sums are whole
        if broadcast:
            assert torch.equal(allocators[1].mask, whole.mask), t
        parted = parted or not torch.equal(allocators[1].mask, whole.mask)
    assert parted is not broadcast  # the skew is real: alone, rank 1 chooses otherwise
    if broadcast:
        for layers, placement in zip(copies, placements):
            mine, reference = _kept_rows(layers, placement), _kept_rows(whole_layers, placement)
            for name in mine:
                torch.testing.assert_close(mine[name], reference[name], rtol=0, atol=0)
