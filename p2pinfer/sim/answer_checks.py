"""Answer checks on the virtual clock: the live entry's probation holds and spot checks.

With ``SimConfig.verify`` set, every simulated node keeps the live node's
:class:`~p2pinfer.core.verify.SpotChecks` (the same object, so the same
probation count, spot-check draw and budget) and, for every forward, draws
the answer's check plan as ``NodeServing`` does (``node/serving.py``):

* **hold** (the peer is on probation here: its first ``probation_answers``
  answers to this node): the client sees nothing until a check passes. With
  an answer of at least ``probation_hold_tokens`` tokens, the first that
  many are checked as soon as they reach the entry, and the first token is
  released when that check ends; the whole answer is checked again at its
  end (that check is the probation verdict). A shorter answer is held whole
  and released after its one check.
* **after** (a spot check, drawn with probability ``fraction`` within the
  ``budget`` share of the entry's served work): checked once streamed; the
  client saw it already, so it costs the entry's engine, not this TTFT.
* **the check itself**: a prefill of prompt + answer on the *entry's*
  engine, less what its cache holds of the prompt, in chunks of
  :data:`~p2pinfer.engines.simulated.SIMULATED_CHECK_CHUNK` tokens, each
  behind the requests waiting for the engine (the simulated engine's FIFO
  lock). It is background work in its ``EngineQueue`` (a slot taken, no
  queued prefill), and with ``SimConfig.check_cache`` its prompt stays in
  the entry's cache afterwards, as the engines' ``check_cache`` leaves it.
  A request's end reaches its lifecycle only after its check, as live.

Simulated peers are honest, so every check passes. Not modelled: spot
checks delegated to a third peer (the entry always checks; delegation
moves that work elsewhere, it never holds a client), the checks' deadlines,
and nodes with several slots (:meth:`SimConfig.validate` refuses the pair).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from ..core.engine_queue import QueueFull, Ticket
from ..core.verify import CheckPlan, Verdict
from ..engines.simulated import SIMULATED_CHECK_CHUNK
from .model import Job, Req, SimConfig, SimNode

__all__ = ["AnswerChecks", "CheckJob"]


def _passed(tokens: int) -> Verdict:
    """What every check of an honest simulated peer finds."""
    return Verdict(ok=True, checked_tokens=tokens, verified_tokens=tokens, test="greedy", statistic=0.0)


class CheckJob:
    """One answer check waiting for, or taking, its node's engine, chunk by chunk."""

    __slots__ = ("req", "gen", "prompt", "answer_tokens", "ticket", "cuts", "chunk_ms", "then", "args")

    def __init__(self, req: Req, prompt: list[int], answer_tokens: int, then: Callable[..., None], args: tuple[Any, ...]) -> None:
        self.req = req
        self.gen = req.gen
        self.prompt = prompt
        self.answer_tokens = answer_tokens
        self.ticket: Ticket | None = None
        self.cuts: list[int] = []
        """Its chunks still to compute, in ms each, the next first."""
        self.chunk_ms: list[float] = []
        self.then = then
        self.args = args


class AnswerChecks:
    """The simulator's answer checks (see the module docstring)."""

    # Provided by the simulator.
    config: SimConfig
    now: float
    at: Callable[..., None]
    link_s: Callable[[SimNode, SimNode], float]
    _compute: Callable[..., None]
    _start: Callable[[SimNode], None]
    _finish_request: Callable[..., None]

    check_stats: Counter[str]
    _windows_in_check: dict[tuple[int, int], tuple[Job, SimNode] | None]
    """(Request id, its generation) -> (job, peer) of an answer that ended while its window was being
    checked (None: not yet): as live, its whole answer's check starts after that one."""

    def _plan_check(self, entry: SimNode, peer_id: str) -> CheckPlan:
        """The forward's check plan, drawn as the live entry draws it (``SpotChecks.plan``)."""
        if entry.checks is None:
            return "none"
        plan = entry.checks.plan(peer_id)
        self.check_stats[f"plan_{plan}"] += 1
        return plan

    def _hold_first_token(self, node: SimNode, job: Job) -> bool:
        """Whether the entry holds this forwarded answer's first token for a check;
        with a probation window, its check is scheduled for when the window arrives."""
        req = job.req
        if req.check != "hold" or job.origin is node:
            return False
        window = self.config.verify.probation_hold_tokens if self.config.verify else 0
        if window and req.output_tokens >= window:
            arrives = self.now + self.config.cost.decode_ms(window) / 1000.0 + self.link_s(node, job.origin)
            self.at(arrives, self._window_arrives, req, req.gen, job.origin, node)
        return True

    def _window_arrives(self, req: Req, gen: int, origin: SimNode, peer: SimNode) -> None:
        if gen != req.gen or req.done or not origin.alive:
            return
        window = self.config.verify.probation_hold_tokens  # type: ignore[union-attr]
        self._windows_in_check[(req.rid, gen)] = None
        self._enqueue_check(origin, req, window, self._window_checked, (req, gen, origin, peer, window))

    def _window_checked(self, req: Req, gen: int, origin: SimNode, peer: SimNode, window: int) -> None:
        ended = self._windows_in_check.pop((req.rid, gen), None)
        if gen != req.gen or req.done or not origin.alive:
            return
        origin.checks.record(peer.id, _passed(window), window=True)  # type: ignore[union-attr]
        self.check_stats["windows"] += 1
        if not req.released:
            req.released = True
            req.first_token = self.now
        if ended is not None:
            self._answer_arrives(req, *ended)

    def _answer_arrives(self, req: Req, job: Job, peer: SimNode) -> None:
        """A checked forward's answer ended and reached its entry: its check runs there."""
        origin = job.origin
        if job.gen != req.gen or req.done or not origin.alive:
            return
        if (req.rid, req.gen) in self._windows_in_check:  # its window's check is still running
            self._windows_in_check[(req.rid, req.gen)] = (job, peer)
            return
        n = min(req.output_tokens, self.config.verify.max_checked_tokens)  # type: ignore[union-attr]
        if req.check == "after":
            new = len(req.tokens) - origin.cache.match(req.tokens, touch=False)
            origin.checks.note_spot_check(new + n)  # type: ignore[union-attr]
        self._enqueue_check(origin, req, n, self._answer_checked, (req, job, peer, n))

    def _answer_checked(self, req: Req, job: Job, peer: SimNode, n: int) -> None:
        origin = job.origin
        if job.gen != req.gen or req.done or not origin.alive:
            return
        origin.checks.record(peer.id, _passed(n))  # type: ignore[union-attr]
        self.check_stats[f"checked_{req.check}"] += 1
        if req.check == "hold" and not req.released:
            req.released = True
            req.first_token = self.now
        self._finish_request(peer, job, at_origin=True)

    # -- the check on the engine -----------------------------------------------
    def _enqueue_check(self, node: SimNode, req: Req, answer_tokens: int, then: Callable[..., None],
                       args: tuple[Any, ...]) -> None:
        prompt = list(req.tokens)
        check = CheckJob(req, prompt, answer_tokens, then, args)
        total = len(prompt) + answer_tokens
        # As the simulated engine's score(): the last prompt token is always evaluated.
        cached = min(node.cache.match(prompt, touch=False), len(prompt) - 1)
        try:
            check.ticket = node.engine.admit(prompt, cached, background=True)
        except QueueFull:  # live: the check cannot run and the answer passes unchecked
            self.check_stats["unavailable"] += 1
            then(*args)
            return
        node.engine.start(check.ticket, cached)
        new = total - cached
        total_ms = self.config.cost.prefill_ms(total, cached)
        pos = cached
        while pos < total:
            size = min(SIMULATED_CHECK_CHUNK, total - pos)
            check.chunk_ms.append(total_ms * size / new)
            pos += size
        self.check_stats["check_tokens"] += new
        node.queue.append(check)  # type: ignore[arg-type]
        if node.current is None:
            self._start(node)

    def _run_check_chunk(self, node: SimNode, check: CheckJob) -> None:
        """``_start`` popped ``check``: its next chunk takes the engine."""
        node.current = check  # type: ignore[assignment]
        duration = check.chunk_ms.pop(0) / 1000.0
        node.busy_s += duration
        self._compute(node, duration, self._check_chunk_done, node, check)

    def _check_chunk_done(self, node: SimNode, check: CheckJob) -> None:
        if not node.alive:
            return
        node.current = None
        if check.chunk_ms:
            node.queue.append(check)  # type: ignore[arg-type]  # behind whoever waits now (a FIFO lock)
        else:
            node.engine.prefilled(check.ticket)  # type: ignore[arg-type]
            node.engine.finish(check.ticket)  # type: ignore[arg-type]
            if self.config.check_cache:
                node.cache.insert(check.prompt)
            check.then(*check.args)
        if node.queue and node.current is None:
            self._start(node)
