"""What an engine's reply saves cost, for ``/status`` and ``/metrics``.

A reply is saved for the next turn after its request's stream has ended
(the llama.cpp engine's reply cache), so its time cannot travel in that
request's record: the engine counts the saves here instead, and an operator
reads them from ``/status`` (``engine.reply_saves``) and from the
``p2pinfer_reply_save_seconds`` histogram.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, field
import statistics
from typing import Any

__all__ = ["REPLY_SAVE_BUCKETS", "ReplySaves"]

REPLY_SAVE_BUCKETS: tuple[float, ...] = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Upper bounds (seconds) of the histogram's buckets; +Inf is implied."""
RECENT = 256
"""Saves the median is taken over (the latest ones)."""


@dataclass
class ReplySaves:
    """Reply saves of one engine: started, ended (each one's own work time), failed."""

    in_progress: int = 0
    """Saves started and not ended: their slots are taken, their tokens in the load."""
    count: int = 0
    """Saves that ended, failed ones included."""
    errors: int = 0
    """Saves that failed (logged; the request had already finished)."""
    dropped: int = 0
    """Saves given up before they ran because a request needed their slot (not in ``count``)."""
    sum_s: float = 0.0
    last_s: float | None = None
    last_wall_s: float | None = None
    """From the end of the last save's answer to the end of its save (other slots' steps included)."""
    buckets: list[int] = field(default_factory=lambda: [0] * (len(REPLY_SAVE_BUCKETS) + 1))
    """Saves per bucket of :data:`REPLY_SAVE_BUCKETS` (not cumulative; the last is +Inf)."""
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT))

    def started(self) -> None:
        self.in_progress += 1

    def ended(self, work_s: float, wall_s: float | None = None, *, failed: bool = False, started: bool = True) -> None:
        """A save ended after ``work_s`` of its own work; ``started``: it was counted by :meth:`started`."""
        if started:
            self.in_progress = max(0, self.in_progress - 1)
        work_s = max(0.0, work_s)
        self.count += 1
        self.errors += 1 if failed else 0
        self.sum_s += work_s
        self.last_s = work_s
        self.last_wall_s = wall_s
        self.buckets[bisect_left(REPLY_SAVE_BUCKETS, work_s)] += 1
        self.recent.append(work_s)

    def gave_up(self) -> None:
        """A started save was dropped before it ran (its reply is not cached)."""
        self.in_progress = max(0, self.in_progress - 1)
        self.dropped += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """The histogram's buckets as Prometheus wants them: ``(le, saves at or below)``."""
        out, total = [], 0
        for bound, n in zip([*map(str, REPLY_SAVE_BUCKETS), "+Inf"], self.buckets):
            total += n
            out.append((bound, total))
        return out

    def as_dict(self) -> dict[str, Any]:
        """The ``/status`` view, in milliseconds."""

        def ms(s: float | None) -> float | None:
            return None if s is None else round(s * 1000, 3)

        return {
            "count": self.count,
            "errors": self.errors,
            "dropped": self.dropped,
            "in_progress": self.in_progress,
            "last_ms": ms(self.last_s),
            "last_wall_ms": ms(self.last_wall_s),
            "median_ms": ms(statistics.median(self.recent)) if self.recent else None,
            "median_of_last": len(self.recent),
            "total_ms": ms(self.sum_s),
        }
