"""The cubic budget schedule (docs/maths.md#budget-schedule, Eq. (12)) and its validation."""

from __future__ import annotations

import itertools

import pytest

from adalora_cli.config import ConfigError
from adalora_cli.methods.allocator import budget_schedule, check_schedule

# b0 = 100, bT = 20, t_i = 10, t_f = 30, T = 140: the cubic runs over 100 steps.
B0, BT, TI, TF, T = 100, 20, 10, 30, 140


def b(t: int) -> int:
    return budget_schedule(t, B0, BT, TI, TF, T)


def test_warm_up_keeps_b0() -> None:
    assert [b(t) for t in (1, 5, TI)] == [B0, B0, B0]


def test_cubic_decay_by_hand() -> None:
    assert b(TI + 1) == 97  # 20 + 80 * 0.99**3 = 97.62
    assert b(59) == 30  # 20 + 80 * 0.51**3 = 30.61
    assert b(60) == 30  # midway: 20 + 80 * 0.5**3 = 30 exactly
    assert b(61) == 29  # 20 + 80 * 0.49**3 = 29.41
    assert b(T - TF) == BT


def test_final_phase_holds_bt() -> None:
    assert [b(t) for t in (T - TF + 1, 130, T)] == [BT, BT, BT]


def test_schedule_is_monotone_and_continuous_at_the_ends() -> None:
    values = [b(t) for t in range(1, T + 1)]
    assert all(x >= y for x, y in itertools.pairwise(values))
    assert values[0] == B0 and values[-1] == BT


def test_exact_floor_where_floats_would_round_down() -> None:
    # (1 - 3/10)**3 * 1000 = 343 exactly, but the float product is 342.99999999999994.
    assert budget_schedule(3, 1000, 0, 0, 0, 10) == 343
    assert budget_schedule(8, 1000, 0, 0, 0, 10) == 8  # (1 - 8/10)**3 * 1000 = 8, not 7


def test_check_schedule_names_the_numbers() -> None:
    check_schedule(B0, BT, TI, TF, T)  # fits: no error
    with pytest.raises(ConfigError, match=r"t_init=600.*t_final=1800.*2400.*T=2000") as err:
        check_schedule(144, 72, 600, 1800, 2000)
    # the fix for a small data set names the key that fixes T
    assert "set train.max_steps above 2400" in str(err.value)
    with pytest.raises(ConfigError, match=r"T=2400"):
        check_schedule(144, 72, 600, 1800, 2400)  # t_i + t_f == T is rejected too
    with pytest.raises(ConfigError, match=r"budget=200.*b0=144"):
        check_schedule(144, 200, 0, 10, 100)
    with pytest.raises(ConfigError, match=r"budget must be >= 1.*got 0"):
        check_schedule(144, 0, 0, 10, 100)
    with pytest.raises(ConfigError, match=r"t_final must be >= 1 when pruning, got 0"):
        check_schedule(144, 72, 0, 0, 100)  # no final phase: pattern could miss b(T)
