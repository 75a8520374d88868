"""The loop's own rows: a non-finite loss stops the run before it reaches metrics.jsonl."""

from __future__ import annotations

import math

import pytest

from adalora_cli.engine.loop import _train_row
from adalora_cli.engine.step import StepLog
from adalora_cli.methods.allocator import StepReport


def test_a_non_finite_loss_fails_before_its_row_is_written():
    with pytest.raises(FloatingPointError, match="loss became nan at step 7; lower "
                                                 "train.learning_rate"):
        _train_row(7, math.nan, StepLog(1e-3), None)
    assert _train_row(7, 0.1234567, StepLog.of(1e-3, StepReport(12)), None) == {
        "step": 7, "loss": 0.123457, "lr": 1e-3, "budget": 12}
