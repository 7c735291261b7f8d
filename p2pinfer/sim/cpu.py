"""Nodes that share one machine's cores (processor sharing).

The simulator's default is one machine per node: a node's prefill runs at
its full speed whatever the others do. A swarm started on one box (the
live benchmark: 4 node processes, 1 thread each, on 2 cores) is not like
that: while k nodes compute at once on c cores, each runs at ``min(1, c /
k)`` of its speed, so concentrating work on few nodes (prefix-aware
routing) makes them faster, and spreading it (round-robin) makes
everyone slower. :class:`SharedCpu` keeps the remaining work of every
running job and re-times their completions whenever that set changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["SharedCpu"]

Schedule = Callable[..., None]
"""``schedule(t, fn, *args)``: run ``fn(*args)`` at virtual time ``t``."""


class SharedCpu:
    def __init__(self, cores: float, schedule: Schedule, clock: Callable[[], float]) -> None:
        if cores <= 0:
            raise ValueError("cores must be > 0")
        self.cores = cores
        self._schedule = schedule
        self._clock = clock
        self._jobs: dict[object, list[Any]] = {}
        """owner -> [remaining work s, token, fn, args]"""
        self._last = 0.0
        self._token = 0

    @property
    def rate(self) -> float:
        """Speed of each running job, as a share of its own full speed."""
        return min(1.0, self.cores / len(self._jobs)) if self._jobs else 1.0

    def running(self) -> int:
        return len(self._jobs)

    def start(self, owner: object, work_s: float, fn: Callable[..., None], *args: Any) -> None:
        """Run ``work_s`` seconds of full-speed work for ``owner`` (one job per owner)."""
        if owner in self._jobs:
            raise ValueError("one job at a time per owner")
        now = self._clock()
        self._advance(now)
        self._jobs[owner] = [max(0.0, work_s), 0, fn, args]
        self._retime(now)

    def cancel(self, owner: object) -> None:
        """Drop ``owner``'s job (its node left); the others speed up."""
        if owner in self._jobs:
            now = self._clock()
            self._advance(now)
            del self._jobs[owner]
            self._retime(now)

    def _advance(self, now: float) -> None:
        done = (now - self._last) * self.rate
        for job in self._jobs.values():
            job[0] = max(0.0, job[0] - done)
        self._last = now

    def _retime(self, now: float) -> None:
        rate = self.rate
        for owner, job in self._jobs.items():
            self._token += 1
            job[1] = self._token
            self._schedule(now + job[0] / rate, self._finish, owner, self._token)

    def _finish(self, owner: object, token: int) -> None:
        job = self._jobs.get(owner)
        if job is None or job[1] != token:
            return  # re-timed or cancelled since
        now = self._clock()
        self._advance(now)
        del self._jobs[owner]
        self._retime(now)
        fn, args = job[2], job[3]
        fn(*args)
