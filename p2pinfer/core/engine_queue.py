"""One admission and queue model for every engine: what a node's load report says.

Both engines (``simulated`` and ``llama-cpp``) and the simulator's nodes keep
their queue accounting here, so a simulated node reports its load exactly
as a live engine does:

* **queued prefill** (``Load.queued_prefill_tokens``): the prompt tokens of
  every accepted request that its prefill will compute, until that prefill
  ends. A waiting request counts what neither the cache nor a prompt ahead
  of it covers: engines cache each prompt when it is served, so a request
  queued behind another with the same prefix finds that prefix cached when
  its turn comes. Counting the whole prompt made a node with two
  same-subject requests queued report several times its real backlog, and
  its peers then computed the prefix cold elsewhere. When its prefill
  starts, the estimate becomes the true size (what the cache gives now).
  A finished answer whose reply is evaluated again for the cache (the
  llama.cpp engine's reply caching) counts those tokens again until that
  ends (:meth:`EngineQueue.saving_reply`): its slot is still taken. Its
  prompt + reply is then a prompt ahead: a next turn that extends it waits
  for the save (the engine's admission) and counts only what goes past it.
* **checks are background work** (``admit(..., background=True)``): an
  answer check (``Engine.score``) holds a slot like a request, so it counts
  in the active requests, the free slots and the wait for one, but its
  tokens are counted apart (:attr:`EngineQueue.background_queued`), not in
  ``queued_prefill_tokens``: a request arriving now has its prefill chunks
  go before a check's (:class:`CheckTurns`), so the wait it is predicted
  (``Load.wait_ms``, what the ``cost`` policy compares) does not include
  them. Nor is a check a prompt ahead: it caches nothing.
* **prompts ahead** (:class:`PromptsAhead`): accepted and not finished, in
  arrival order, in tokens.
* **speed** (``Load.prefill_ms_per_token``): an EWMA (weight 0.25) of the
  measured ms per uncached token, for prefills of 16 tokens or more;
  shorter ones are dominated by fixed costs.
* **slots**: requests served at once. The llama.cpp engine batches
  ``slots`` requests (continuous batching); the simulated engine and the
  simulator's nodes serve one at a time (``slots=1``). :meth:`can_start`
  admits a waiting request into prefill while fewer than ``slots`` run.
* **free slots and the wait for one** (``Load.free_slots``,
  ``Load.slot_wait_ms``): a request arriving now finds ``slots`` less the
  requests accepted (running or waiting) free. With none free it waits
  for a slot to free: the engine gives each running request's expected end
  (its ``max_tokens`` at the measured decode speed, from the end of its
  prefill: an upper bound, since answers may end sooner), and the
  requests waiting ahead take the slots in arrival order as they free.
  Without a decode speed (``decode_ms_per_token`` never given) the wait
  is not estimated (0).

It only counts: the FIFO gate itself (a trio semaphore in an engine, a
deque in the simulator) stays with its owner.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
import heapq
from typing import Literal

from .peers import Load

__all__ = [
    "CHECK_EVERY", "CheckTurns", "EngineQueue", "PromptsAhead", "QueueFull", "Ticket", "shared_prefix_len", "waits_for_prefix",
]

SPEED_WEIGHT = 0.25
"""Weight of the newest measurement in the prefill speed estimate."""
MIN_TIMED_PREFILL = 16
"""Prefills shorter than this are dominated by fixed costs; not timed."""
CHECK_EVERY = 8
"""A check's chunk runs at least once in this many chunk turns (see :class:`CheckTurns`)."""


class CheckTurns:
    """Whose prompt chunk an engine evaluates next: a request's or a check's.

    An engine that evaluates one prompt chunk at a time (the llama.cpp slot
    loop: one chunk per iteration, then one decode step for every decoding
    slot) asks :meth:`next` before each chunk. Requests go first, so an
    answer check never delays a request's first token by more than one
    chunk in ``every``; a check is never starved: while requests keep
    prefilling, it still gets every ``every``-th chunk turn, and all of them
    when no request is prefilling.
    """

    def __init__(self, every: int = CHECK_EVERY) -> None:
        if every < 1:
            raise ValueError("every must be >= 1")
        self.every = every
        self.passed = 0
        """Chunk turns a waiting check has been passed over in a row."""

    def next(self, request_ready: bool, check_ready: bool) -> Literal["request", "check"] | None:
        """``"request"``, ``"check"`` or None (nothing to evaluate), given who has a chunk ready."""
        if check_ready and (not request_ready or self.passed >= self.every - 1):
            self.passed = 0
            return "check"
        if request_ready:
            if check_ready:
                self.passed += 1
            return "request"
        return None


def shared_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    if type(a) is not type(b):
        a, b = list(a), list(b)
    n = min(len(a), len(b))
    lo, hi = 0, n
    # Binary search on slice equality: C-speed comparisons, O(log n) of them.
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def waits_for_prefix(
    tokens: Sequence[int], cached: int, ahead: Iterable[Sequence[int]], block_size: int, max_reuse: int | None = None
) -> bool:
    """Whether a request that could take a free slot now should wait instead.

    ``ahead``: what work in service (or queued before it) will have cached
    when it ends: prompts still in prefill, prompt + reply of replies being
    saved, the prompts waiting ahead of this one. ``cached``: what the cache
    gives ``tokens`` now. If some of that work will cache at least one block
    more of its prefix than the cache holds now (``max_reuse``: the most
    cached tokens it may use), it waits: it then restores that prefix
    instead of computing it a second time in parallel, in a second slot.
    Others go past it. The admission rule of the llama.cpp engine and of the
    simulator's nodes with several slots: one rule, so that the simulator
    predicts what the engine does.
    """
    pending = max((shared_prefix_len(p, tokens) for p in ahead), default=0)
    if max_reuse is not None:
        pending = min(pending, max_reuse)
    return pending >= cached + block_size


class PromptsAhead:
    """Prompts accepted and not finished, in arrival order."""

    def __init__(self) -> None:
        self._prompts: list[Sequence[int]] = []

    def __len__(self) -> int:
        return len(self._prompts)

    def covered(self, tokens: Sequence[int]) -> int:
        """Leading tokens of ``tokens`` that some prompt ahead will have cached."""
        return max((shared_prefix_len(p, tokens) for p in self._prompts), default=0)

    def add(self, tokens: Sequence[int]) -> None:
        self._prompts.append(tokens)

    def remove(self, tokens: Sequence[int]) -> None:
        """Drop this very sequence (by identity: equal prompts may be queued twice)."""
        for i, p in enumerate(self._prompts):
            if p is tokens:
                del self._prompts[i]
                return


class QueueFull(Exception):
    """``max_queue`` requests are accepted already; the engine answers BUSY."""


@dataclass(eq=False, slots=True)
class Ticket:
    """One accepted request, from :meth:`EngineQueue.admit` to :meth:`EngineQueue.finish`."""

    tokens: Sequence[int]
    """Its prompt; while its reply is saved, prompt + reply (what it leaves cached)."""
    estimate: int
    """Its prompt tokens still counted as queued prefill."""
    max_tokens: int = 0
    """Its answer's length limit (what the wait for its slot is estimated from)."""
    decode_ends: float | None = None
    """When its answer is expected to end (seconds, the owner's clock), once its prefill is done."""
    background: bool = False
    """An answer check: its tokens count in ``background_queued``, not in the queued prefill."""
    started: bool = False
    finished: bool = False


class EngineQueue:
    """See the module docstring.

    ``ms_per_token`` is the speed reported before any measurement;
    ``speed_measured`` says whether it is a measurement already (the
    simulator knows its nodes' speed) or a guess the first measurement
    replaces (a live engine's default). ``max_reuse(n)``: the most cached
    tokens a prompt of ``n`` tokens can reuse (llama.cpp evaluates the last
    two itself); default all of them. ``decode_ms_per_token``: the decode
    speed the wait for a free slot is estimated with, until
    :meth:`decode_measured` replaces it (None: no estimate, the wait is 0).
    """

    def __init__(
        self,
        *,
        ms_per_token: float,
        speed_measured: bool = True,
        max_queue: int | None = None,
        slots: int = 1,
        max_reuse: Callable[[int], int] | None = None,
        decode_ms_per_token: float | None = None,
    ) -> None:
        if slots < 1:
            raise ValueError("an engine serves at least one request at a time")
        self.slots = slots
        self.max_queue = max_queue
        self.ms_per_token = max(ms_per_token, 1e-3)
        self.speed_measured = speed_measured
        self._max_reuse = max_reuse
        self.decode_ms_per_token = decode_ms_per_token
        self.ahead = PromptsAhead()
        self._tickets: list[Ticket] = []
        """Accepted and not finished, in arrival order."""
        self.queued = 0
        """Uncached prompt tokens of requests waiting for or in prefill."""
        self.background_queued = 0
        """Uncached tokens of answer checks waiting for or in prefill (not in the load's queued prefill)."""
        self.active = 0
        """Requests accepted and not finished."""
        self.running = 0
        """Requests started (in prefill or decode) and not finished."""

    def load(self, now: float | None = None) -> Load:
        """The load report; ``now`` (the clock of :meth:`prefilled`'s ``now``)
        is needed for the wait for a free slot, else it is reported as 0."""
        free = max(0, self.slots - self.active)
        wait = self.slot_wait_ms(now) if now is not None and not free else 0.0
        return Load(max(0, self.queued), self.ms_per_token, self.active, self.slots, free, wait, self.speed_measured)

    def slot_wait_ms(self, now: float) -> float:
        """How long a request arriving at ``now`` waits for a free slot (see the module docstring)."""
        dms = self.decode_ms_per_token
        if dms is None or self.active < self.slots:
            return 0.0
        pms = self.ms_per_token
        ends: list[float] = []
        waiting: list[Ticket] = []
        for t in self._tickets:
            if not t.started:
                waiting.append(t)
            elif t.decode_ends is not None:
                ends.append(t.decode_ends)
            else:  # still in prefill
                ends.append(now + (t.estimate * pms + t.max_tokens * dms) / 1000.0)
        ends += [now] * max(0, self.slots - len(ends))
        heapq.heapify(ends)
        for t in waiting:  # each takes the first slot to free, and holds it for its own answer
            start = max(now, heapq.heappop(ends))
            heapq.heappush(ends, start + (t.estimate * pms + t.max_tokens * dms) / 1000.0)
        return max(0.0, (ends[0] - now) * 1000.0)

    def _count(self, ticket: Ticket, delta: int) -> None:
        if ticket.background:
            self.background_queued += delta
        else:
            self.queued += delta

    def can_start(self) -> bool:
        return self.running < self.slots

    def admit(self, tokens: Sequence[int], cached: int, max_tokens: int = 0, *, background: bool = False) -> Ticket:
        """Accept ``tokens``, of which the cache holds ``cached`` leading ones
        now (``cache.match(tokens, touch=False)``), for an answer of at most
        ``max_tokens``; raises :class:`QueueFull`. ``background``: an answer
        check (see the module docstring): it counts ``cached`` only, since
        the prompts ahead may be evicted before it runs, and is no prompt
        ahead of later requests."""
        if self.max_queue is not None and self.active >= self.max_queue:
            raise QueueFull(f"{self.active} requests queued (limit {self.max_queue})")
        n = len(tokens)
        covered = cached if background else max(cached, self.ahead.covered(tokens))
        if self._max_reuse is not None:
            covered = min(covered, self._max_reuse(n))
        ticket = Ticket(tokens, n - covered, max(0, max_tokens), background=background)
        if not background:
            self.ahead.add(tokens)
        self._tickets.append(ticket)
        self.active += 1
        self._count(ticket, ticket.estimate)
        return ticket

    def start(self, ticket: Ticket, reused: int) -> None:
        """Its prefill starts and will reuse ``reused`` tokens: it counts at its true size."""
        uncached = len(ticket.tokens) - reused
        self._count(ticket, uncached - ticket.estimate)
        ticket.estimate = uncached
        ticket.started = True
        self.running += 1

    def reuse(self, ticket: Ticket, reused: int) -> None:
        """Its prefill reuses ``reused`` tokens after all (a planned restore
        failed, say): it counts at that size. Only between :meth:`start` and
        :meth:`prefilled`."""
        if ticket.started and not ticket.finished and ticket.estimate:
            uncached = len(ticket.tokens) - reused
            self._count(ticket, uncached - ticket.estimate)
            ticket.estimate = uncached

    def prefilled(
        self, ticket: Ticket, uncached: int = 0, ms_per_token: float | None = None, now: float | None = None
    ) -> None:
        """Its prefill is done (no longer queued work); ``ms_per_token`` is
        what it measured for its ``uncached`` tokens, if timed; ``now`` dates
        the start of its answer (for the wait for a free slot)."""
        self._count(ticket, -ticket.estimate)
        ticket.estimate = 0
        if now is not None and self.decode_ms_per_token is not None:
            ticket.decode_ends = now + ticket.max_tokens * self.decode_ms_per_token / 1000.0
        if ms_per_token is not None and uncached >= MIN_TIMED_PREFILL:
            if self.speed_measured:
                self.ms_per_token = max(1e-3, (1 - SPEED_WEIGHT) * self.ms_per_token + SPEED_WEIGHT * ms_per_token)
            else:
                self.ms_per_token = max(1e-3, ms_per_token)
                self.speed_measured = True

    def saving_reply(self, ticket: Ticket, reply: Sequence[int], now: float | None = None) -> None:
        """Its answer is done and its ``reply`` tokens are being evaluated
        again (prefill work, in its slot): they count as queued prefill, and
        its slot is expected to free once they are done, until :meth:`finish`.
        Its prompt + reply is a prompt ahead from now on: a request that
        extends it counts only what the save does not cache."""
        if ticket.finished:
            return
        tokens = len(reply)
        self._count(ticket, tokens - ticket.estimate)
        ticket.estimate = tokens
        if not ticket.background and tokens:
            self.ahead.remove(ticket.tokens)
            ticket.tokens = [*ticket.tokens, *reply]
            self.ahead.add(ticket.tokens)
        if now is not None:
            ticket.decode_ends = now + tokens * self.ms_per_token / 1000.0

    def decode_measured(self, ms_per_token: float) -> None:
        """A finished answer's decode speed: the estimate moves towards it (EWMA)."""
        old = self.decode_ms_per_token
        new = max(1e-3, ms_per_token)
        self.decode_ms_per_token = new if old is None else (1 - SPEED_WEIGHT) * old + SPEED_WEIGHT * new

    def finish(self, ticket: Ticket) -> None:
        """Done, failed or cancelled: it leaves the queue (idempotent)."""
        if ticket.finished:
            return
        ticket.finished = True
        if not ticket.background:
            self.ahead.remove(ticket.tokens)
        for i, t in enumerate(self._tickets):
            if t is ticket:
                del self._tickets[i]
                break
        self._count(ticket, -ticket.estimate)
        ticket.estimate = 0
        self.active -= 1
        if ticket.started:
            self.running -= 1
