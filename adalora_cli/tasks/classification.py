"""Your own labelled texts (docs/own-model.md#your-own-labels-on-an-encoder): a table with a
text column (or two, for pairs) and a label column, classified or regressed on an encoder.

The labels come from the data, as Hugging Face's ``run_glue.py`` reads them: class names
(``billing``, ``shipping``, ...) or integer ids make a classifier whose head has one output
per class, in sorted order (integer ids numerically); numbers with a decimal point make a
regressor with one output (``task.regression`` decides it the other way when needed). A hub
dataset whose label column is a ``ClassLabel`` keeps that feature's names and order.
``task.labels`` states the classes instead of reading them. Whatever the training split
settles is written into the run's ``config.yaml`` (``task.labels``, ``task.regression``)
by :meth:`ClassificationTask.recorded`, so ``adalora eval``, ``predict`` and ``export``
rebuild the same head with the same names without reading the data again.

Everything else is GLUE's recipe (:mod:`.glue`): ``AutoModelForSequenceClassification``
with ``id2label`` set from the names, pairs encoded as two segments truncated
longest-first, length-sorted evaluation. Scores: accuracy and macro-averaged F1 for a
classifier, Pearson and Spearman correlation and the mean squared error for a regressor.
What cannot train is one line naming the file: a label column that mixes numbers and
names, a training split with one label only, a validation label the training split never
has.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from typing import Any

import datasets
import numpy as np

from ..config import ConfigError, RunConfig
from ..rundir.summary import ReportColumn, TaskReport
from . import data as rawdata
from .glue import TextClassificationSpec, TextClassificationTask

SPLITS = ("train", "validation")
LABEL_COLUMN = "label"
"""The label column when task.label_column is unset."""
CLASSIFIER_METRICS = ("accuracy", "macro_f1")
REGRESSOR_METRICS = ("pearson", "spearman", "mse")
SHOWN_NAMES = 6
"""Class names the report's title lists before it says how many more there are."""
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
"""A cell written as a number (``3``, ``-0.5``, ``1e-3``); ``nan`` or ``inf`` are names."""


# ------------------------------------------------------------------------- label cells


def cell(value: Any) -> Any:
    """A label cell as read, or None for an empty one (missing, null, NaN, blank)."""
    if value is None or isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, str):
        return value.strip() or None
    return value


def number(value: Any) -> float | None:
    """The number a cell holds (a number, or a string written as one); None for a name."""
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, (int, float, np.integer, np.floating)):
        return float(value)
    if isinstance(value, str) and _NUMBER.fullmatch(value):
        return float(value)
    return None


def has_fraction(value: Any) -> bool:
    """A number written with a decimal point or exponent, or a float: a regression label."""
    if isinstance(value, (float, np.floating)):
        return True
    return isinstance(value, str) and number(value) is not None and not value.lstrip(
        "+-").isdigit()


def class_name(value: Any) -> str:
    """The class name of a (non-empty) cell: ints and integral floats as ``3``, booleans as
    JSON writes them, text as written."""
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        return str(int(value)) if float(value).is_integer() else repr(float(value))
    text = str(value).strip()
    if text.lstrip("+-").isdigit():  # "03" and "3" are one id
        return str(int(text))
    return text


def sorted_names(names: set[str]) -> tuple[str, ...]:
    """Class names in id order: integer ids numerically, any other names as text sorts."""
    if all(n.lstrip("-").isdigit() for n in names):
        return tuple(sorted(names, key=int))
    return tuple(sorted(names))


def _mixed(cells: list[Any], where: str, column: str) -> None:
    numbers = [c for c in cells if number(c) is not None]
    names = [c for c in cells if number(c) is None]
    if numbers and names:
        raise ConfigError(
            f"{where}: label column {column!r} mixes numbers ({numbers[0]!r}) and names "
            f"({names[0]!r}); write every label as a class name, or every one as a number "
            "(a number with a decimal point means regression)")


def infer_labels(values: Sequence[Any], where: str, column: str,
                 regression: bool | None) -> tuple[str, ...] | None:
    """The class names a training split's label ``values`` hold, sorted; None when they make
    a regressor (``regression`` True, or None and a label has a decimal point)."""
    cells = [c for c in map(cell, values) if c is not None]
    if not cells:
        raise ConfigError(f"{where} has no labels in column {column!r}; fill it, or name the "
                          "label column with task.label_column")
    _mixed(cells, where, column)
    if regression or regression is None and any(has_fraction(c) for c in cells):
        if number(cells[0]) is None:
            raise ConfigError(f"{where}: task.regression=true needs numeric labels, but "
                              f"column {column!r} holds names ({cells[0]!r}); drop "
                              "task.regression to train a classifier")
        distinct = {number(c) for c in cells}
        if len(distinct) == 1:
            raise ConfigError(f"{where}: every label in column {column!r} is "
                              f"{cells[0]!r}, so a regressor has nothing to learn; check "
                              "task.label_column, or give rows with other values")
        return None
    names = sorted_names({class_name(c) for c in cells})
    if len(names) == 1:
        raise ConfigError(f"{where} has one label only ({names[0]!r} in column {column!r}); "
                          "a classifier needs two or more: add rows of the other classes, "
                          "or check task.label_column")
    return names


# ------------------------------------------------------------------------- the task


class ClassificationTask(TextClassificationTask):
    """Classification, or regression, on the user's own table; labels settled from the data
    (or from the config that recorded them) the first time the head's size is asked for."""

    def __init__(self, cfg: RunConfig):
        task = cfg.task
        self.cfg = cfg
        self.name = task.name
        self.eval_split_names = SPLITS[1:]
        self.text_columns = (task.text_column,) + ((task.text_pair_column,)
                                                   if task.text_pair_column else ())
        self.label_column = task.label_column or LABEL_COLUMN
        self._raw: dict[str, datasets.Dataset] | None = None
        self._spec: TextClassificationSpec | None = None
        if task.regression:
            self._spec = self._make_spec(None)
        elif task.labels is not None:
            self._spec = self._make_spec(tuple(name.strip() for name in task.labels))

    def _make_spec(self, names: tuple[str, ...] | None) -> TextClassificationSpec:
        metrics = REGRESSOR_METRICS if names is None else CLASSIFIER_METRICS
        return TextClassificationSpec(self.name, self.text_columns, names or (), metrics,
                                      metrics[0], eval_splits=SPLITS[1:], hub_dataset=None)

    @property
    def spec(self) -> TextClassificationSpec:  # type: ignore[override]
        """The head's labels: recorded in the config, else read from the training split."""
        if self._spec is None:
            self._spec = self._make_spec(self._infer())
        return self._spec

    @property
    def num_labels(self) -> int:  # type: ignore[override]
        return self.spec.num_labels

    @property
    def primary_metric(self) -> str:  # type: ignore[override]
        return self.spec.primary_metric

    def recorded(self, cfg: RunConfig) -> RunConfig:
        spec = self.spec
        task = dataclasses.replace(cfg.task, labels=list(spec.label_names) or None,
                                   regression=spec.is_regression)
        return dataclasses.replace(cfg, task=task)

    # ---------------------------------------------------------------- data

    def load_raw(self) -> dict[str, datasets.Dataset]:
        """The train and validation tables (read once: the labels and the encoding share
        them), each checked for the text and label columns."""
        if self._raw is None:
            task = self.cfg.task
            raw = rawdata.load_splits(task, SPLITS, dataset=task.dataset)
            for split, ds in raw.items():
                needed = [*self.text_columns, self.label_column]
                missing = [c for c in needed if c not in ds.column_names]
                if missing:
                    raise ConfigError(
                        f"{self._where(split)} lacks column {missing[0]!r} (it has "
                        f"{', '.join(ds.column_names)}); name the columns with "
                        "task.text_column, task.text_pair_column and task.label_column")
            # carved here, not only when encoding: the labels are read from these tables
            self._raw = rawdata.carve_holdout(raw, task.holdout, self._where("train"))
        return self._raw

    def _where(self, split: str) -> str:
        return rawdata.describe_source(self.cfg.task, split, dataset=self.cfg.task.dataset)

    def _cells(self, split: str) -> list[Any]:
        """A split's label cells, a hub ClassLabel's ids turned into its names."""
        ds = self.load_raw()[split]
        column = self.label_column
        values = list(ds[column])
        feature = ds.features.get(column)
        if isinstance(feature, datasets.ClassLabel):
            return [feature.int2str(int(v)) if v is not None and v >= 0 else None
                    for v in values]
        return values

    def _infer(self) -> tuple[str, ...] | None:
        task = self.cfg.task
        feature = self.load_raw()["train"].features.get(self.label_column)
        if isinstance(feature, datasets.ClassLabel) and not task.regression:
            names: tuple[str, ...] | None = tuple(feature.names)  # the dataset's own order
        else:
            names = infer_labels(self._cells("train"), self._where("train"),
                                 self.label_column, task.regression)
        for split in SPLITS[1:]:  # a label the head lacks is found now, not after training
            self._targets(self._cells(split), split, self._make_spec(names))
        return names

    def _targets(self, cells: list[Any], split: str, spec: TextClassificationSpec
                 ) -> list[int | float | None]:
        """Class ids (or a regressor's numbers) of one split's cells; None where empty."""
        where, column = self._where(split), self.label_column
        cells = [cell(c) for c in cells]
        if spec.is_regression:
            names = [c for c in cells if c is not None and number(c) is None]
            if names:
                raise ConfigError(f"{where}: label {names[0]!r} is not a number, but this "
                                  "task is a regression (numeric training labels); write "
                                  f"numbers in column {column!r}")
            return [None if c is None else number(c) for c in cells]
        ids = {n: i for i, n in enumerate(spec.label_names)}
        unknown = [c for c in cells if c is not None and class_name(c) not in ids]
        if unknown:
            known, label = ", ".join(spec.label_names), class_name(unknown[0])
            if self.cfg.task.labels is None:  # read from the training split just now
                raise ConfigError(f"{where}: label {label!r} is not among the training "
                                  f"split's labels ({known}); fix the label, or add training "
                                  "rows of that class")
            raise ConfigError(f"{where}: label {label!r} is not one of the classes in "
                              f"task.labels ({known}); fix the label (a model knows only "
                              "the classes it was built with)")
        return [None if c is None else ids[class_name(c)] for c in cells]

    def prepare(self, ds: datasets.Dataset, split: str, tokenizer: Any,
                limit: int | None) -> tuple[datasets.Dataset, int]:
        """Encoded, labelled rows of one split, and how many rows without a label were left
        out (a regressor's labels may be negative, so no -1 marks them)."""
        targets = self._targets(self._cells(split), split, self.spec)
        return self.labelled(ds, targets, [y is not None for y in targets], limit, tokenizer)

    def load_data(self, tokenizer: Any):
        data = super().load_data(tokenizer)
        spec = self.spec
        data.info.update(labels=list(spec.label_names), regression=spec.is_regression)
        return data

    # ---------------------------------------------------------------- report and predict

    def report(self, metrics: dict[str, dict[str, float]]) -> TaskReport:
        """Accuracy and macro-F1 (x100) under a title naming the classes; a regressor's
        Pearson, Spearman (x100) and mean squared error."""
        spec, val = self.spec, SPLITS[1:]
        if spec.is_regression:
            title = f"regression ({self.label_column})"
            columns = (ReportColumn("Pearson", val, "pearson", 100),
                       ReportColumn("Spearman", val, "spearman", 100),
                       ReportColumn("MSE", val, "mse", 1, lower_is_better=True))
        else:
            names = list(spec.label_names)
            shown = ", ".join(names[:SHOWN_NAMES])
            if len(names) > SHOWN_NAMES:
                shown += f" and {len(names) - SHOWN_NAMES} more"
            title = f"classification ({shown})"
            columns = (ReportColumn("Acc", val, "accuracy", 100),
                       ReportColumn("Macro-F1", val, "macro_f1", 100))
        return TaskReport(title, "other", columns)

    def predict_columns(self, columns: Sequence[str], where: str) -> list[str]:
        missing = [c for c in self.text_columns if c not in columns]
        if missing:
            keys = "task.text_column" + (" and task.text_pair_column"
                                         if len(self.text_columns) > 1 else "")
            raise ConfigError(f"{where} lacks column {missing[0]!r} (it has "
                              f"{', '.join(columns) or 'no columns'}); the run reads "
                              f"{', '.join(self.text_columns)} (its {keys})")
        return list(self.text_columns)


def classification_task(cfg: RunConfig) -> ClassificationTask:
    return ClassificationTask(cfg)
