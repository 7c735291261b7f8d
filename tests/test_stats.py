"""The one percentile, mean, median and summary every report uses (p2pinfer/stats.py)."""

from __future__ import annotations

import math

from hypothesis import given, strategies as st
import numpy as np
import pytest

from p2pinfer.stats import percentile, rounded, summary

values = st.lists(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False), min_size=1, max_size=50)


def test_nearest_rank_is_always_one_of_the_values_and_linear_interpolates() -> None:
    xs = [40.0, 10.0, 30.0, 20.0]
    assert percentile(xs, 50) == 20.0 and percentile(xs, 51) == 30.0 and percentile(xs, 100) == 40.0
    assert percentile(xs, 50, method="linear") == 25.0
    assert percentile(xs, 90, method="linear") == pytest.approx(37.0)
    assert percentile([7.0], 99, method="linear") == 7.0
    assert math.isnan(percentile([], 50)) and math.isnan(percentile([], 50, method="linear"))
    assert rounded(percentile([], 50, method="linear"), 3) is None
    with pytest.raises(ValueError, match="nearest"):
        percentile(xs, 50, method="midpoint")  # type: ignore[arg-type]


@given(values, st.floats(min_value=0, max_value=100))
def test_linear_is_numpys_default(xs: list[float], q: float) -> None:
    assert percentile(xs, q, method="linear") == pytest.approx(float(np.percentile(xs, q)), rel=1e-9, abs=1e-6)


@given(values, st.floats(min_value=0, max_value=100))
def test_nearest_rank_has_at_least_q_percent_at_or_below(xs: list[float], q: float) -> None:
    p = percentile(xs, q)
    assert p in xs
    assert sum(1 for x in xs if x <= p) >= q / 100 * len(xs) - 1e-9


def test_summary_gives_the_spread_with_the_true_median() -> None:
    assert summary([]) == {}
    assert summary([4.0, 1.0, 3.0, 2.0]) == {"n": 4, "min": 1.0, "p10": 1.0, "median": 2.5, "p90": 4.0, "max": 4.0}
    assert summary([0.123456], digits=2)["median"] == 0.12
