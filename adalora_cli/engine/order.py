"""The order of training batches, resumable in the middle of an epoch.

An epoch's order is drawn from one ``torch.Generator`` seeded with ``train.seed``. The
default order is exactly what ``DataLoader(shuffle=True, generator=g)`` produces (torch's own
``RandomSampler`` and ``BatchSampler`` draw it), so runs keep the batches they always had.
To resume, the loop saves the generator's state at the start of the epoch and how many
batches it has used; restoring that state redraws the same permutation, and the batches
already used are skipped as index lists (nothing is loaded or collated twice).

On several processes each global batch is cut into one slice per rank (see
``distributed.py``); the order, and so T, is that of one process.

``train.group_by_length`` instead cuts the epoch's permutation into windows of 50 batches,
sorts each window by length so a batch holds examples of similar length (less padding),
and shuffles the order of the batches with the same generator.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import BatchSampler, RandomSampler, Sampler

from .distributed import World, shard

GROUP_WINDOW = 50
"""Batches per window sorted by length under group_by_length (Hugging Face's Trainer
uses the same factor for its megabatches)."""


class EpochBatches(Sampler[list[int]]):
    """Shuffled batches of the training set; ``skip`` batches are dropped once, on resume."""

    def __init__(self, data: Any, batch_size: int, generator: torch.Generator,
                 lengths: Sequence[int] | None = None, world: World | None = None):
        self.n = len(data)
        self.world = world or World()
        self.weight = 1.0
        """Weight of this rank's mean loss for the batch last yielded (distributed.shard)."""
        self.batch_size = batch_size
        self.generator = generator
        self.lengths = list(lengths) if lengths is not None else None
        self._inner = BatchSampler(RandomSampler(data, generator=generator), batch_size,
                                   drop_last=False)
        self.skip = 0

    def __len__(self) -> int:
        return -(-self.n // self.batch_size)

    def _grouped(self) -> list[list[int]]:
        perm = torch.randperm(self.n, generator=self.generator).tolist()
        window = self.batch_size * GROUP_WINDOW
        batches = []
        for start in range(0, self.n, window):
            # stable sort, longest first: ties keep the permutation's order
            chunk = sorted(perm[start:start + window], key=lambda i: -self.lengths[i])
            batches += [chunk[i:i + self.batch_size]
                        for i in range(0, len(chunk), self.batch_size)]
        order = torch.randperm(len(batches), generator=self.generator).tolist()
        return [batches[k] for k in order]

    def __iter__(self) -> Iterator[list[int]]:
        skip, self.skip = self.skip, 0
        batches = iter(self._grouped()) if self.lengths is not None else iter(self._inner)
        for k, batch in enumerate(batches):
            if k < skip:
                continue
            if self.world.distributed:  # this rank's slice of the global micro-batch
                batch, self.weight = shard(batch, self.world)
            yield batch


def example_lengths(data: Any) -> list[int]:
    """Tokens per training example (its ``input_ids``), for grouping by length."""
    return [len(data[i]["input_ids"]) for i in range(len(data))]
