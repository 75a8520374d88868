"""What a task family hands to the training loop.

A task knows how to build its model (the right head for the pretrained checkpoint), how
to load and encode its data (hub or local files), and how to score a split. The loop
only calls these; it never looks at column names or metric definitions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn
from torch.utils.data import Dataset


@dataclass
class TaskData:
    train: Dataset
    """Encoded training examples; items are dicts of tensors/lists the collate fn batches."""
    eval_splits: dict[str, Dataset]
    """Encoded evaluation splits by name, e.g. {"validation": ...} or MNLI's matched and
    mismatched sets."""
    collate: Callable[[list[dict[str, Any]]], dict[str, torch.Tensor]]
    """Pads a list of items into a batch that the model accepts as ``model(**batch)``
    (including ``labels``, so the model returns ``.loss``)."""
    info: dict[str, Any] = field(default_factory=dict)
    """Facts for the summary, e.g. split sizes."""
    notes: list[str] = field(default_factory=list)
    """One line each for the user, e.g. which rows were left out and why."""


class Task(Protocol):
    name: str
    """Task key as written in the config (e.g. ``rte``)."""

    def build_model(self) -> tuple[nn.Module, Any]:
        """The pretrained model with this task's head, and its tokenizer."""
        ...

    def load_data(self, tokenizer: Any) -> TaskData:
        ...

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str, data: Dataset, *, batch_size: int,
                 collate: Callable, device: torch.device,
                 autocast: Callable[[], Any]) -> dict[str, float]:
        """Metrics of one split, e.g. {"accuracy": 0.91}. ``autocast()`` returns the
        context manager the loop uses for mixed precision."""
        ...

    # Optional: tasks whose evaluation produces predictions (SQuAD answers, summaries)
    # also define ``save_predictions(run_dir: Path) -> list[Path]``; the loop calls it once
    # after the final evaluation, so predictions land beside the metrics.
