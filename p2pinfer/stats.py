"""The summary statistics every report uses (simulator figures, benchmarks).

One definition each, so that a p99 means the same thing in every JSON the
project writes: :func:`percentile` is the nearest-rank percentile (or, where
a benchmark published it so, ``method="linear"``: numpy's default); an empty
input gives NaN, which :func:`rounded` turns into ``None`` for JSON.
:func:`summary` is the spread of a distribution in one dict.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
import math
import statistics
from typing import Any, Literal

__all__ = ["mean", "median", "percentile", "rounded", "summary"]

PercentileMethod = Literal["nearest", "linear"]


def percentile(values: Sequence[float], q: float, *, method: PercentileMethod = "nearest") -> float:
    """The ``q``-th percentile (``q`` in 0..100); NaN for no values.

    ``nearest`` (the default, every simulator figure): nearest rank, always
    one of the values. ``linear``: linear interpolation between the two
    closest ranks (numpy's default), which ``bench concurrency`` and ``lab
    nat`` publish.
    """
    if not values:
        return math.nan
    ordered = values if all(a <= b for a, b in zip(values, values[1:])) else sorted(values)
    if method == "nearest":
        return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]
    if method != "linear":
        raise ValueError(f"percentile method must be 'nearest' or 'linear', not {method!r}")
    k = (len(ordered) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return float(ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo))


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


def summary(values: Sequence[float], digits: int = 4) -> dict[str, Any]:
    """``n``, ``min``, nearest-rank ``p10``, ``median``, nearest-rank ``p90`` and ``max``; ``{}`` for no values."""
    if not values:
        return {}
    return {
        "n": len(values),
        "min": round(min(values), digits),
        "p10": round(percentile(values, 10), digits),
        "median": round(median(values), digits),
        "p90": round(percentile(values, 90), digits),
        "max": round(max(values), digits),
    }
