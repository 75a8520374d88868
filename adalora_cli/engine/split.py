"""``train.length_split``: one batch run as several micro-batches, each padded on its own.

A batch in random order is mostly padding (48 % on the demo): every example is padded to
the longest one. With ``length_split = k`` the batch's examples are sorted by length and
cut into k pieces of near-equal size, each padded only to its own longest example. The
pieces' gradients add up in ``.grad`` before the optimizer step, each piece's mean loss
weighted by its share of the batch's loss, so the step sees the gradient of the same
batch's mean loss: the same examples in the same optimizer step, the same T and
schedules. What differs is float rounding and the dropout masks, which are drawn per piece
(a different draw from the same distribution). On CPU fewer padded tokens means less
compute (4 pieces of a demo batch carry 37 % fewer tokens; a step takes about a quarter
less time, ``benchmarks/step_time.py``). On a GPU one wide batch usually runs faster
than several narrow ones: keep 1.

k = 1 (the default) leaves the batch exactly as the task's collate function builds it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

IGNORE = -100
"""Label value the models' cross-entropy ignores (padded target tokens)."""

Batch = dict[str, torch.Tensor]


def loss_units(batch: Batch) -> int:
    """What the model's mean loss averages over: target tokens for a sequence of labels
    (summarization: the loss is a mean over non-padded label tokens), else examples
    (classification, regression, span extraction: a mean over the batch)."""
    labels = batch.get("labels")
    if isinstance(labels, torch.Tensor) and labels.dim() >= 2:
        return int((labels != IGNORE).sum())
    return int(batch["input_ids"].shape[0])


class LengthSplit:
    """A collate function for the training loader: items -> [(batch, share), ...].

    ``share`` weighs the piece's mean loss so the shares sum to 1 over the batch (see
    :func:`loss_units`); with ``pieces == 1`` the result is ``[(collate(items), 1.0)]``."""

    def __init__(self, collate: Callable[[list[dict[str, Any]]], Batch], pieces: int = 1):
        self.collate = collate
        self.pieces = pieces

    def __call__(self, items: list[dict[str, Any]]) -> list[tuple[Batch, float]]:
        k = min(self.pieces, len(items))
        if k <= 1:
            return [(self.collate(items), 1.0)]
        # stable sort, longest first: the order of equal lengths stays the batch's order
        order = sorted(range(len(items)), key=lambda i: -len(items[i]["input_ids"]))
        n = len(order)
        batches = [self.collate([items[i] for i in order[(j * n) // k:((j + 1) * n) // k]])
                   for j in range(k)]
        units = [loss_units(b) for b in batches]
        total = sum(units)
        if total == 0:  # nothing the loss counts (all labels ignored): weigh by examples
            units, total = [len(b["input_ids"]) for b in batches], n
        return [(b, u / total) for b, u in zip(batches, units)]
