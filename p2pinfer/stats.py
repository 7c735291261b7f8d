"""The summary statistics every report uses (simulator figures, benchmarks).

One definition each, so that a p99 means the same thing in every JSON the
project writes: :func:`percentile` is the nearest-rank percentile; an empty
input gives NaN, which :func:`rounded` turns into ``None`` for JSON.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
import math
import statistics

__all__ = ["mean", "median", "percentile", "rounded"]


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank ``q``-th percentile (``q`` in 0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = values if all(a <= b for a, b in zip(values, values[1:])) else sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def mean(values: Iterable[float]) -> float:
    """Arithmetic mean; NaN for no values."""
    values = list(values)
    return statistics.fmean(values) if values else math.nan


def median(values: Iterable[float]) -> float:
    values = list(values)
    return float(statistics.median(values)) if values else math.nan


def rounded(x: float, digits: int = 2) -> float | None:
    """``x`` rounded for a report; ``None`` for NaN (no values)."""
    return None if math.isnan(x) else round(x, digits)
