"""GLUE (docs/maths.md#tasks-and-metrics): eight sentence and sentence-pair tasks on one
classifier recipe.

A :class:`TextClassificationSpec` states everything task-specific: the hub columns, the
label names in the hub's id order (empty for STS-B's regression), the metrics, and the
evaluation splits. :class:`TextClassificationTask` turns a spec into the training loop's
:class:`~adalora_cli.tasks.base.Task`: it builds ``AutoModelForSequenceClassification``
with the right head, reads the raw splits (hub or local files, see :mod:`.data`), maps
label names to ids, drops unlabeled rows (label -1, as in the hub's test splits), encodes
single sentences or pairs (pairs truncated longest-first), and scores a split. The number
of labels is known from the spec alone, so a dry run can build the model without data.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import datasets
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from ..config import ConfigError, RunConfig
from . import data as rawdata
from . import eval_order, metrics, progress
from .base import Task, TaskData, require
from .pretrained import LOAD_ERRORS, from_pretrained, load_failed, load_tokenizer

GLUE_HUB = "nyu-mll/glue"


@dataclass(frozen=True)
class TextClassificationSpec:
    name: str
    text_columns: tuple[str, ...]
    """One column (single sentences) or two (pairs, encoded as a pair)."""
    label_names: tuple[str, ...]
    """Class names in the hub's id order; empty means regression with one output."""
    metrics: tuple[str, ...]
    primary_metric: str
    """The headline number of the task (the paper's table column)."""
    eval_splits: tuple[str, ...] = ("validation",)
    hub_dataset: str | None = GLUE_HUB
    """Default hub source (config name = task name); None means no hub source."""

    @property
    def is_regression(self) -> bool:
        return not self.label_names

    @property
    def num_labels(self) -> int:
        return len(self.label_names) or 1


GLUE_SPECS: dict[str, TextClassificationSpec] = {s.name: s for s in [
    TextClassificationSpec("cola", ("sentence",), ("unacceptable", "acceptable"),
                           ("matthews",), "matthews"),
    TextClassificationSpec("sst2", ("sentence",), ("negative", "positive"),
                           ("accuracy",), "accuracy"),
    TextClassificationSpec("mrpc", ("sentence1", "sentence2"),
                           ("not_equivalent", "equivalent"), ("accuracy", "f1"), "accuracy"),
    TextClassificationSpec("qqp", ("question1", "question2"),
                           ("not_duplicate", "duplicate"), ("accuracy", "f1"), "accuracy"),
    TextClassificationSpec("stsb", ("sentence1", "sentence2"), (),
                           ("pearson", "spearman", "corr"), "corr"),
    TextClassificationSpec("mnli", ("premise", "hypothesis"),
                           ("entailment", "neutral", "contradiction"), ("accuracy",),
                           "accuracy", eval_splits=("validation_matched",
                                                    "validation_mismatched")),
    TextClassificationSpec("qnli", ("question", "sentence"),
                           ("entailment", "not_entailment"), ("accuracy",), "accuracy"),
    TextClassificationSpec("rte", ("sentence1", "sentence2"),
                           ("entailment", "not_entailment"), ("accuracy",), "accuracy"),
]}


class TextClassificationTask(Task):
    """A sequence classification (or STS-B style regression) task built from a spec."""

    model_class = "AutoModelForSequenceClassification"
    holds_out = True
    """``task.holdout`` carves its ``heldout`` split (docs/tuning.md)."""

    def __init__(self, spec: TextClassificationSpec, cfg: RunConfig):
        self.spec = spec
        self.cfg = cfg
        self.name = spec.name
        self.primary_metric = spec.primary_metric
        self.num_labels = spec.num_labels
        self.eval_split_names = spec.eval_splits

    # ---------------------------------------------------------------- model

    def build_model(self, dtype: torch.dtype = torch.float32) -> tuple[nn.Module, Any]:
        import transformers

        path = self.cfg.model.name_or_path
        kwargs: dict[str, Any] = {"num_labels": self.num_labels}
        if self.spec.is_regression:
            kwargs["problem_type"] = "regression"
        else:
            kwargs["problem_type"] = "single_label_classification"
            kwargs["id2label"] = dict(enumerate(self.spec.label_names))
            kwargs["label2id"] = {n: i for i, n in enumerate(self.spec.label_names)}
        try:
            tokenizer = load_tokenizer(path)
            model = from_pretrained(getattr(transformers, self.model_class), path, dtype,
                                    **kwargs)
        except LOAD_ERRORS as err:  # missing folder, hub unreachable, no such or gated repo
            raise load_failed(path, err) from None
        return model, tokenizer

    # ---------------------------------------------------------------- data

    def load_raw(self) -> dict[str, datasets.Dataset]:
        """Raw train and evaluation splits, with the hub's columns."""
        task = self.cfg.task
        dataset = task.dataset or self.spec.hub_dataset
        return rawdata.load_splits(task, ["train", *self.spec.eval_splits], dataset=dataset,
                                   config_name=self.spec.name if dataset else None)

    def _where(self, split: str) -> str:
        task = self.cfg.task
        dataset = task.dataset or self.spec.hub_dataset
        return rawdata.describe_source(task, split, dataset=dataset,
                                       config_name=self.spec.name)

    def label_ids(self, values: list[Any], where: str) -> list[int] | list[float]:
        """Labels as the hub's ids (or floats for regression); -1 marks unlabeled rows.

        Local files may carry ids, id strings, or the class names; empty cells and nulls
        count as unlabeled."""
        if self.spec.is_regression:
            try:
                return [-1.0 if v is None or v == "" else float(v) for v in values]
            except ValueError as err:
                raise ConfigError(f"{where}: {self.name} labels must be numbers ({err})") from None
        by_name = {n: i for i, n in enumerate(self.spec.label_names)}
        out: list[int] = []
        for v in values:
            if v is None or v == "":
                out.append(-1)
            elif isinstance(v, str):
                key = v.strip().lower()
                if key in by_name:
                    out.append(by_name[key])
                elif key.lstrip("-").isdigit():
                    out.append(int(key))
                else:
                    raise ConfigError(f"{where}: label {v!r} is not one of "
                                      f"{', '.join(self.spec.label_names)} or an id "
                                      f"0..{self.num_labels - 1}")
            else:
                out.append(int(v))
        bad = [x for x in out if not -1 <= x < self.num_labels]
        if bad:
            raise ConfigError(f"{where}: label id {bad[0]} is out of range for {self.name} "
                              f"({self.num_labels} classes: {', '.join(self.spec.label_names)})")
        return out

    def prepare(self, ds: datasets.Dataset, split: str, tokenizer: Any,
                limit: int | None) -> tuple[datasets.Dataset, int]:
        """Encoded, labeled rows of one raw split, and how many unlabeled rows were dropped."""
        where = self._where(split)
        rawdata.require_columns(ds, [*self.spec.text_columns, "label"], where)
        labels = self.label_ids(list(ds["label"]), where)
        return self.labelled(ds, labels, [y >= 0 for y in labels], limit, tokenizer)

    def labelled(self, ds: datasets.Dataset, targets: list[Any], kept: list[bool],
                 limit: int | None, tokenizer: Any) -> tuple[datasets.Dataset, int]:
        """The rows ``kept`` says (the first ``limit`` of them) encoded with their
        ``targets`` as labels, and how many rows were left out as unlabelled."""
        keep = [i for i, k in enumerate(kept) if k]
        dropped = len(targets) - len(keep)
        if limit is not None:
            keep = keep[:limit]
        ds = ds.select(keep) if len(keep) < len(targets) else ds
        encoded = self.encode(ds, tokenizer)
        return encoded.add_column("labels", [targets[i] for i in keep]), dropped

    def encode(self, ds: datasets.Dataset, tokenizer: Any) -> datasets.Dataset:
        """Token ids of the text column(s); pairs go in as pairs (two segments)."""
        columns, max_length = self.spec.text_columns, self.cfg.task.max_length

        def tokenize(batch: dict[str, list]) -> dict[str, list]:
            texts = [["" if x is None else str(x) for x in batch[c]] for c in columns]
            return dict(tokenizer(*texts, truncation="longest_first", max_length=max_length))

        return ds.map(tokenize, batched=True, remove_columns=ds.column_names,
                      desc=f"tokenizing {self.name}")

    def load_data(self, tokenizer: Any) -> TaskData:
        from transformers import DataCollatorWithPadding

        task = self.cfg.task
        raw = rawdata.carve_holdout(self.load_raw(), task.holdout, self._where("train"))
        info: dict[str, Any] = {"task": self.name, "num_labels": self.num_labels}
        splits: dict[str, datasets.Dataset] = {}
        for split, ds in raw.items():
            limit = task.max_train_samples if split == "train" else task.max_eval_samples
            splits[split], dropped = self.prepare(ds, split, tokenizer, limit)
            info[f"{split}_examples"] = len(splits[split])
            if dropped:
                info[f"{split}_unlabeled_dropped"] = dropped
            info[f"{split}_source"] = (
                f"{task.holdout} rows of {self._where('train')} (lowest row hashes)"
                if split == rawdata.HELDOUT else self._where(split))
        for split, ds in splits.items():
            if len(ds) == 0:
                raise ConfigError(f"{info[f'{split}_source']} has no labeled rows; "
                                  "give the split labeled data")
        train = splits.pop("train")
        return TaskData(train=train, eval_splits=splits,
                        collate=DataCollatorWithPadding(tokenizer), info=info)

    # ---------------------------------------------------------------- scoring

    @torch.no_grad()
    def predict(self, model: nn.Module, data: Dataset, *, batch_size: int,
                collate: Callable, device: torch.device,
                autocast: Callable[[], Any]) -> tuple[np.ndarray, np.ndarray]:
        """Logits ``(n, num_labels)`` and labels ``(n,)`` of a split, in data order
        (computed in length-sorted batches, see :mod:`.eval_order`)."""
        was_training = model.training
        model.eval()
        all_logits, all_labels = [], []
        batches = eval_order.sorted_batches(eval_order.input_lengths(data), batch_size)
        try:
            for batch in progress.counted(
                    DataLoader(data, batch_sampler=batches, collate_fn=collate), "scoring",
                    total=len(data), size=lambda b: len(b["input_ids"])):
                batch = {k: v.to(device) for k, v in batch.items()}
                with autocast():
                    logits = model(**batch).logits
                all_logits.append(logits.float().cpu())
                all_labels.append(batch["labels"].cpu())
        finally:
            model.train(was_training)
        return (eval_order.restore_array(torch.cat(all_logits).numpy(), batches),
                eval_order.restore_array(torch.cat(all_labels).numpy(), batches))

    def compute_metrics(self, logits: np.ndarray, labels: np.ndarray) -> dict[str, float]:
        """The task's metrics from raw logits: argmax for classes, the one output otherwise."""
        logits = np.asarray(logits)
        preds = logits[:, 0] if self.spec.is_regression else logits.argmax(axis=-1)
        return metrics.compute(self.spec.metrics, preds, np.asarray(labels))

    def metric_names(self) -> tuple[str, ...]:
        return tuple(self.spec.metrics)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str, data: Dataset, *, batch_size: int,
                 collate: Callable, device: torch.device,
                 autocast: Callable[[], Any]) -> dict[str, float]:
        logits, labels = self.predict(model, data, batch_size=batch_size, collate=collate,
                                      device=device, autocast=autocast)
        return self.compute_metrics(logits, labels)

    # ---------------------------------------------------------------- predict

    def predict_columns(self, columns: Sequence[str], where: str) -> list[str]:
        return require(columns, self.spec.text_columns, where)

    @torch.no_grad()
    def predict_rows(self, model: nn.Module, tokenizer: Any, ds: datasets.Dataset,
                     device: torch.device) -> list[dict[str, Any]]:
        """``label`` (the class name) and ``scores`` (softmax probability per class);
        ``score`` for a regression task (STS-B)."""
        from transformers import DataCollatorWithPadding

        batch = DataCollatorWithPadding(tokenizer)(list(self.encode(ds, tokenizer)))
        logits = model(**{k: v.to(device) for k, v in batch.items()}).logits.float().cpu()
        if self.spec.is_regression:
            return [{"score": float(x)} for x in logits[:, 0]]
        probs = logits.softmax(dim=-1)
        names = self.spec.label_names
        return [{"label": names[int(p.argmax())],
                 "scores": {n: round(float(v), 6) for n, v in zip(names, p)}} for p in probs]


def glue_task(cfg: RunConfig) -> TextClassificationTask:
    return TextClassificationTask(GLUE_SPECS[cfg.task.name], cfg)
