"""Schedules as pure functions of the step: T and the learning-rate multiplier.

AdaLoRA's budget schedule b(t) lives with the allocator (``methods/allocator.py``); these
are the loop's own: how many optimizer steps a run has, and the linear warm-up/decay.
"""

from __future__ import annotations

import math

from ..config import RunConfig


def total_steps(n_train: int, cfg: RunConfig) -> int:
    """T in optimizer steps (docs/maths.md#budget-schedule), counted on the global batch."""
    t = cfg.train
    if t.max_steps:
        return t.max_steps
    per_epoch = math.ceil(n_train / (t.batch_size * t.grad_accum))
    return max(1, math.ceil(per_epoch * t.epochs))


def linear_schedule(warmup: int, total: int):
    """lr multiplier at optimizer step ``step`` (0-based as LambdaLR counts)."""
    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total - step) / max(1, total - warmup))
    return factor
