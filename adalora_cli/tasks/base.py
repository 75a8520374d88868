"""What a task family owns, and what every command asks it for.

A task knows how to build its model (the right head for the pretrained checkpoint, and the
same model on the meta device from ``config.json`` alone for planning), how to load and
encode its data (hub or local files), how to score a split, which way each of its metrics
is better, what it writes beside the scores (predictions), and what ``adalora predict``
writes for a row. The loop, ``adalora eval``, ``predict``, the sweep planner and the report
only ask; none of them looks at a column name, a metric definition or a task's class. A
family subclasses :class:`Task` (litgpt's ``DataModule`` is the shape): what it must say is
abstract, so a family that forgets one cannot be built, and the rest has a default.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from ..config import ConfigError, RunConfig
from ..rundir.summary import TaskReport
from .columns import task_report


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


def no_autocast() -> contextlib.AbstractContextManager:
    """The ``autocast`` of a run without mixed precision (``adalora predict``)."""
    return contextlib.nullcontext()


class Task(ABC):
    name: str
    """Task key as written in the config (e.g. ``rte``)."""
    cfg: RunConfig
    model_class: str = ""
    """The transformers auto class the task's model is (``AutoModelForSequenceClassification``
    ...): what :meth:`build_model` loads and :meth:`skeleton` builds, so the two never
    disagree about the module tree, and with it about n."""

    # ---------------------------------------------------------------- model

    @abstractmethod
    def build_model(self, dtype: torch.dtype = torch.float32) -> tuple[nn.Module, Any]:
        """The pretrained model with this task's head, and its tokenizer."""

    def check_model_config(self, config: Any) -> None:
        """Refuse, in one line, a checkpoint this task cannot train (by its ``config.json``);
        called by :meth:`skeleton` and by the families' :meth:`build_model`. By default
        any checkpoint with a ``model_class`` head is taken."""
        return None

    def skeleton(self, config: Any) -> nn.Module:
        """The model :meth:`build_model` would load, built from ``config`` (a transformers
        config) on the meta device: every module with its shape, no weights. What the sweep
        counts n on (docs/maths.md#budget-levels), on a machine without the weights."""
        import transformers

        self.check_model_config(config)
        auto = getattr(transformers, self.model_class)
        with torch.device("meta"):
            return auto.from_config(config)

    def recorded(self, cfg: RunConfig) -> RunConfig:
        """The config a run directory records: ``cfg`` with what this task settled from its
        data written out (the class names the classification task read from its training
        split), so that ``config.yaml`` alone rebuilds the run's model. By default ``cfg``."""
        return cfg

    # ---------------------------------------------------------------- data and scores

    @abstractmethod
    def load_data(self, tokenizer: Any) -> TaskData:
        ...

    @abstractmethod
    def evaluate(self, model: nn.Module, split: str, data: Dataset, *, batch_size: int,
                 collate: Callable, device: torch.device,
                 autocast: Callable[[], Any]) -> dict[str, float]:
        """Metrics of one split, e.g. {"accuracy": 0.91}. ``autocast()`` returns the
        context manager the loop uses for mixed precision."""

    def metric_names(self) -> tuple[str, ...] | None:
        """Every metric :meth:`evaluate` may return for a split, known once the data is
        loaded: ``train.select_metric`` is checked against them before a run starts. None
        (the default) leaves the check to the run's first evaluation."""
        return None

    def report(self, metrics: dict[str, dict[str, float]]) -> TaskReport:
        """How ``adalora report`` shows this task: its title, table and columns, each with
        the direction it is better in (``metrics``: the run's {split: {name: value}}). The
        declarations are torch-free, in :mod:`.columns`, so the report can read them too."""
        return task_report(self.name, metrics)

    def save_predictions(self, run_dir: Path) -> list[Path]:
        """Write the last evaluation's predictions (SQuAD's answers, summaries) into
        ``run_dir``; the files written. The loop calls it after the final evaluation and
        ``adalora eval`` after its own; a task without predictions writes nothing."""
        return []

    # ---------------------------------------------------------------- predict

    @abstractmethod
    def predict_columns(self, columns: Sequence[str], where: str) -> list[str]:
        """Refuse, in one line naming ``where`` (``--input FILE``), an ``adalora predict``
        input without the columns :meth:`predict_rows` reads: checked before the model
        loads. Returns the columns it will read from a table with ``columns``, each of
        which every row must fill (``adalora predict`` refuses a null or empty one)."""

    @abstractmethod
    def predict_rows(self, model: nn.Module, tokenizer: Any, ds: Any,
                     device: torch.device) -> list[dict[str, Any]]:
        """``adalora predict``: one JSON-ready dict per row of ``ds`` (a datasets.Dataset in
        the columns :meth:`predict_columns` checked), in row order."""


def require(columns: Sequence[str], needed: Sequence[str], where: str) -> list[str]:
    """A table (``columns``) lacking one of ``needed`` is a one-line ConfigError; returns
    ``needed``."""
    missing = [c for c in needed if c not in columns]
    if missing:
        raise ConfigError(f"{where} lacks column {missing[0]!r} (it has "
                          f"{', '.join(columns) or 'no columns'}); the task reads "
                          f"{', '.join(needed)}")
    return list(needed)
