"""GLUE metrics computed with numpy, scikit-learn and scipy (docs/maths.md#tasks-and-metrics).

The usual ``evaluate.load("glue", ...)`` fetches its metric scripts from the hub, which
this project cannot reach, so the same definitions are written out here: accuracy, binary
F1 with class 1 as the positive class, Matthews correlation, Pearson and Spearman
correlation, and GLUE's "corr" (the mean of the two, reported for STS-B). Your own labels
(the classification task) add macro-averaged F1 over any number of classes and, for a
regressor, the mean squared error. Every function takes predictions and references as 1-D
array-likes and returns a plain float.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

import numpy as np

# scikit-learn and scipy are imported by the metrics that need them, not here: together
# they add about a second to start-up, and accuracy (most tasks' only metric) needs neither.


def accuracy(predictions, references) -> float:
    """Fraction of exact matches (what ``sklearn.metrics.accuracy_score`` returns)."""
    x, y = np.asarray(predictions), np.asarray(references)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"accuracy needs two 1-D arrays of one length, got shapes "
                         f"{x.shape} and {y.shape}")
    return float(np.mean(x == y)) if len(x) else float("nan")


def f1(predictions, references) -> float:
    """Binary F1 of class 1; 0.0 (not a warning) when nothing is predicted positive."""
    from sklearn.metrics import f1_score

    return float(f1_score(references, predictions, pos_label=1, average="binary",
                          zero_division=0))


def macro_f1(predictions, references) -> float:
    """The unweighted mean of each class's F1, over the classes that occur in the references
    or the predictions (scikit-learn's ``average="macro"``); a class never predicted scores
    0.0 there, without a warning."""
    from sklearn.metrics import f1_score

    return float(f1_score(references, predictions, average="macro", zero_division=0))


def matthews(predictions, references) -> float:
    """Matthews correlation; 0.0 when either side is constant (sklearn's convention)."""
    from sklearn.metrics import matthews_corrcoef

    return float(matthews_corrcoef(references, predictions))


def _correlation(fn: Callable, predictions, references) -> float:
    # A constant prediction vector (an untrained regressor) has no correlation: report
    # NaN, as scipy does, without its ConstantInputWarning flooding the log.
    x, y = np.asarray(predictions, dtype=float), np.asarray(references, dtype=float)
    if len(x) < 2:
        return float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        value = fn(x, y)
    return float(value.statistic if hasattr(value, "statistic") else value[0])


def pearson(predictions, references) -> float:
    from scipy import stats

    return _correlation(stats.pearsonr, predictions, references)


def spearman(predictions, references) -> float:
    from scipy import stats

    return _correlation(stats.spearmanr, predictions, references)


def mse(predictions, references) -> float:
    """Mean squared error of a regressor's outputs (lower is better)."""
    x, y = np.asarray(predictions, dtype=float), np.asarray(references, dtype=float)
    return float(np.mean((x - y) ** 2)) if len(x) else float("nan")


def corr(predictions, references) -> float:
    """GLUE's STS-B summary: the mean of Pearson and Spearman correlation."""
    return (pearson(predictions, references) + spearman(predictions, references)) / 2


METRICS: dict[str, Callable[..., float]] = {
    "accuracy": accuracy,
    "f1": f1,
    "macro_f1": macro_f1,
    "matthews": matthews,
    "pearson": pearson,
    "spearman": spearman,
    "corr": corr,
    "mse": mse,
}
"""Metric functions by the names used in metric dicts and run summaries."""


def compute(names: Sequence[str], predictions, references) -> dict[str, float]:
    """``{name: value}`` for each requested metric, in the order given."""
    unknown = [n for n in names if n not in METRICS]
    if unknown:
        raise KeyError(f"unknown metric {unknown[0]!r}; known: {', '.join(METRICS)}")
    return {name: METRICS[name](predictions, references) for name in names}
