"""Metrics against values worked out by hand (no library computes the expected numbers)."""

import math

import pytest

from adalora_cli.tasks import metrics

# 10 examples: TP = 3, FN = 1, FP = 2, TN = 4.
LABELS = [1, 1, 1, 1, 0, 0, 0, 0, 0, 0]
PREDS = [1, 1, 1, 0, 1, 1, 0, 0, 0, 0]


def test_accuracy_counts_matches():
    assert metrics.accuracy(PREDS, LABELS) == pytest.approx(7 / 10)


def test_f1_of_positive_class():
    # precision 3/5, recall 3/4: F1 = 2TP / (2TP + FP + FN) = 6/9.
    assert metrics.f1(PREDS, LABELS) == pytest.approx(2 / 3)


def test_matthews_from_confusion_matrix():
    # (TP*TN - FP*FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = (12 - 2) / sqrt(5*4*6*5)
    assert metrics.matthews(PREDS, LABELS) == pytest.approx(10 / math.sqrt(600))


def test_degenerate_classifiers_score_zero():
    assert metrics.matthews([0] * 10, LABELS) == 0.0
    assert metrics.f1([0] * 10, LABELS) == 0.0


def test_pearson_spearman_and_glue_corr():
    x, y = [1, 2, 3, 4], [2, 4, 5, 9]
    # deviations (-1.5, -.5, .5, 1.5) and (-3, -1, 0, 4): r = 11 / sqrt(5 * 26)
    assert metrics.pearson(x, y) == pytest.approx(11 / math.sqrt(130))
    assert metrics.spearman(x, y) == pytest.approx(1.0)  # same order
    # rank differences (0, 1, 1, 0): rho = 1 - 6 * 2 / (4 * 15)
    assert metrics.spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert metrics.corr(x, y) == pytest.approx((11 / math.sqrt(130) + 1.0) / 2)


def test_constant_regressor_has_no_correlation():
    assert math.isnan(metrics.pearson([2.0, 2.0, 2.0], [1.0, 2.0, 3.0]))
    assert math.isnan(metrics.corr([1.0], [1.0]))


def test_compute_keeps_requested_order_and_plain_floats():
    out = metrics.compute(["accuracy", "f1"], PREDS, LABELS)
    assert list(out) == ["accuracy", "f1"]
    assert all(type(v) is float for v in out.values())
    with pytest.raises(KeyError, match="unknown metric 'bleu'"):
        metrics.compute(["bleu"], PREDS, LABELS)
