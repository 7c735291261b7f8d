"""A sliding one-second message budget per gossip origin, for the topic validators."""

from __future__ import annotations

from collections import deque
import time

__all__ = ["OriginRateLimit"]


class OriginRateLimit:
    """At most ``per_second`` messages from one origin in any second; origins
    idle for 5 s are forgotten once more than 4,096 are tracked."""

    def __init__(self, per_second: int) -> None:
        self.per_second = per_second
        self._windows: dict[str, deque[float]] = {}

    def allow(self, sender: str) -> bool:
        now = time.monotonic()
        window = self._windows.setdefault(sender, deque())
        while window and now - window[0] > 1.0:
            window.popleft()
        if len(window) >= self.per_second:
            return False
        window.append(now)
        if len(self._windows) > 4096:  # forget idle origins
            for key in [k for k, w in self._windows.items() if not w or now - w[-1] > 5.0]:
                del self._windows[key]
        return True
