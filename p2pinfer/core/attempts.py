"""The life of one request at its entry node, without I/O: events in, actions out.

A request goes where the policy ranked it: the chosen target first, then the
fallbacks in order, at most ``RouterConfig.max_attempts`` peers, and this
node always in the plan (at its rank, or last). :class:`RequestAttempts`
holds that plan and what each try did; its driver runs the actions and
reports what came of them:

* actions out: :class:`ForwardTo` (send it to a peer, continuing from
  ``resume_from`` tokens already produced), :class:`ServeHere` (run it on
  this node's engine), :class:`Sanction` (a peer was just found overclaiming
  its cache: enforce the verdict at the network edge), :class:`Fail`
  (nobody could serve it, or its deadline passed), :class:`Finish` (served);
* events in: :class:`Refused` (the target answered an error code, ``BUSY``
  above all), :class:`PeerLost` (the forward broke), :class:`Done` (the
  target's final record), :class:`Rejected` (the answer, held back until
  checked, failed the check: :mod:`~p2pinfer.core.verify`),
  :class:`DeadlinePassed`.

It applies what each event means to the :class:`~p2pinfer.core.router.Router`
(a BUSY peer is backed off, a lost peer leaves the view until it is heard
from again, a finished forward's reuse updates trust) and reads no clock:
``now`` comes with each event. The live node (``p2pinfer/node``) drives it
with libp2p streams and the engine, the simulator with events on a virtual
clock; both run this code, so the rules cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .policies import LOCAL, Candidate, Decision
from .router import Router

__all__ = [
    "Action",
    "Attempt",
    "DeadlinePassed",
    "Done",
    "Event",
    "Fail",
    "Finish",
    "ForwardTo",
    "PeerLost",
    "Refused",
    "Rejected",
    "RequestAttempts",
    "Sanction",
    "ServeHere",
    "StoppedAtEntry",
]


# -- events in ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Refused:
    """The target answered with an error code instead of a result (``BUSY``,
    ``MODEL_MISMATCH``, ``DEADLINE``, ``INTERNAL``...); for this node's own
    engine, ``BUSY`` means its queue is full."""

    code: str
    message: str = ""
    generated: int = 0
    """Tokens this try had produced before it ended."""


@dataclass(frozen=True, slots=True)
class PeerLost:
    """The forward was lost: dial failure, reset, dead peer, stall, garbage."""

    message: str = ""
    generated: int = 0


@dataclass(frozen=True, slots=True)
class Done:
    """The serving engine's final record arrived."""

    reused_tokens: int
    generated: int = 0
    wrong: str = ""
    """Set when a check of the answer, made after it was streamed, failed: the
    request is done (the client has the tokens) and the peer is sanctioned."""


@dataclass(frozen=True, slots=True)
class Rejected:
    """The answer was held back until checked and failed: only its first
    ``verified`` tokens count; the request continues elsewhere from them."""

    verified: int
    reason: str


@dataclass(frozen=True, slots=True)
class DeadlinePassed:
    message: str = ""


@dataclass(frozen=True, slots=True)
class StoppedAtEntry:
    """The entry, which renders the whole answer over every try, found a stop
    string that the serving engine went past (one spanning two tries, which
    neither try's engine saw whole, or a peer that ignores stop strings) and
    ended the try there. The request is done; the engine's final record never
    came, so the try's reuse is not judged."""

    generated: int = 0


Event = Refused | PeerLost | Done | StoppedAtEntry | Rejected | DeadlinePassed


# -- actions out ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ForwardTo:
    peer: str
    predicted_match_tokens: int
    resume_from: int = 0
    """Tokens already produced by earlier tries; the prompt continues with them."""


@dataclass(frozen=True, slots=True)
class ServeHere:
    predicted_match_tokens: int
    resume_from: int = 0


@dataclass(frozen=True, slots=True)
class Sanction:
    """``peer`` advertised a cache it does not hold: the router distrusts it
    and has dropped it from the view; the edge keeps it out for ``distrust_s``."""

    peer: str
    reason: str


@dataclass(frozen=True, slots=True)
class Fail:
    reason: Literal["exhausted", "deadline"]
    message: str


@dataclass(frozen=True, slots=True)
class Finish:
    """Served. ``record_missing``: a lost peer had sent every token but its final record."""

    record_missing: bool = False


Action = ForwardTo | ServeHere | Sanction | Fail | Finish


@dataclass
class Attempt:
    """One try at serving a request (the first, or a fallback)."""

    target: str
    """Peer id, or this node's own id when served locally."""
    local: bool
    predicted_reused_tokens: int
    resumed_tokens: int = 0
    """Tokens generated by earlier attempts that this one continued from."""
    outcome: str = "pending"
    """``done``, an error code (``BUSY``...), ``failed`` (peer lost) or ``deadline``."""
    message: str = ""
    generated_tokens: int = 0
    reused_tokens: int | None = None
    check: str = ""
    """What a check of its answer found (``passed``, ``rejected``,
    ``failed_after_streaming``, ``error``), or empty when not checked."""
    held_tokens: int = 0
    """Tokens of its answer held back from the client until checked (a
    probation answer's window, ``VerifyConfig.probation_hold_tokens``)."""
    path: str | None = None
    """``local``, or how the request reached the peer: ``direct``, ``hole-punched``
    or ``relayed`` (set by the driver; ``None`` when no stream was opened)."""
    stream_bytes: int = 0
    """Bytes of the forward stream's frames, request and answer, as this node
    wrote and read them (set by the driver; 0 when served locally): what a relay
    carries for a relayed forward, before Noise and yamux framing."""

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


# -- the state machine ----------------------------------------------------------------------


@dataclass
class RequestAttempts:
    """One request's tries at one entry node; see the module docstring.

    ``start()`` gives the first action; each :meth:`handle` takes what came
    of the current try and gives the next actions. ``max_tokens`` (``None``:
    never reached) ends the request when every token is out even though the
    final record was lost; ``prefer`` (a peer id, or :data:`LOCAL`) is tried
    first, before the policy's ranking.
    """

    router: Router
    decision: Decision
    tokens: Sequence[int]
    block_hashes: Sequence[int] = ()
    max_tokens: int | None = None
    prefer: str | None = None
    attempts: list[Attempt] = field(default_factory=list)
    produced: int = 0
    """Tokens produced so far, over every try."""
    state: Literal["new", "trying", "done", "failed"] = "new"
    _plan: list[Candidate] = field(default_factory=list)
    _local_tried: bool = False
    _peers_tried: int = 0

    @property
    def current(self) -> Attempt:
        return self.attempts[-1]

    @property
    def served(self) -> Attempt | None:
        """The attempt that served the request, once it is done."""
        return self.attempts[-1] if self.state == "done" and self.attempts else None

    def start(self) -> list[Action]:
        if self.state != "new":
            raise RuntimeError("a request's attempts start once")
        cands = list(self.decision.candidates)
        if self.prefer:
            target = LOCAL if self.prefer in (LOCAL, self.router.node_id) else self.prefer
            first = next((c for c in cands if c.target == target), None)
            if first is None:
                blocks = self.router.view.longest_matches(self.block_hashes).get(target, 0) if target != LOCAL else 0
                first = Candidate(target, blocks * self.router.hasher.block_size, 0.0)
            cands = [first] + [c for c in cands if c is not first]
        self._plan = cands
        self.state = "trying"
        return [self._next()]

    def handle(self, event: Event, now: float) -> list[Action]:
        """What came of the current try; ``now`` on the caller's clock."""
        if self.state != "trying":
            raise RuntimeError(f"no try in progress (state {self.state})")
        attempt = self.current
        if isinstance(event, DeadlinePassed):
            attempt.outcome, attempt.message = "deadline", event.message
            self._end("failed")
            return [Fail("deadline", f"request not done within its deadline: {event.message}")]
        router = self.router
        if isinstance(event, Rejected):
            # Its unverified tokens were never shown: they do not count.
            attempt.generated_tokens += event.verified
            self.produced += event.verified
            attempt.outcome, attempt.message = "WRONG_TOKENS", event.reason
            router.on_wrong_answer(attempt.target, now)
            sanction = Sanction(attempt.target, f"it returned wrong tokens: {event.reason}")
            if self.max_tokens is not None and self.produced >= self.max_tokens:
                self._end("done")
                return [sanction, Finish()]
            return [sanction, self._next()]
        attempt.generated_tokens += event.generated
        self.produced += event.generated
        if isinstance(event, Done):
            attempt.outcome, attempt.reused_tokens = "done", event.reused_tokens
            self._end("done")
            if event.wrong and not attempt.local:
                attempt.message = f"wrong tokens: {event.wrong}"
                router.on_wrong_answer(attempt.target, now)
                return [Sanction(attempt.target, f"it returned wrong tokens: {event.wrong}"), Finish()]
            return [*self._judge(attempt, event.reused_tokens, now), Finish()]
        if isinstance(event, StoppedAtEntry):
            attempt.outcome = "done"
            self._end("done")
            return [Finish(record_missing=True)]
        if isinstance(event, Refused):
            attempt.outcome, attempt.message = event.code, event.message
            if not attempt.local:
                if event.code == "BUSY":
                    router.on_busy_refusal(attempt.target, now)  # the paper's valve: stay away a while
                elif event.code == "MODEL_MISMATCH":
                    router.on_peer_gone(attempt.target)  # it runs another model, whatever it gossiped
        else:
            attempt.outcome, attempt.message = "failed", event.message
            # It may have died or restarted: what we believed it caches is void
            # until it is heard from again.
            router.on_peer_gone(attempt.target)
        if self.max_tokens is not None and self.produced >= self.max_tokens:
            self._end("done")
            return [Finish(record_missing=True)]
        return [self._next()]

    # -- inside -------------------------------------------------------------------------------
    def _end(self, state: Literal["done", "failed"]) -> None:
        self.state = state
        self.tokens = self.block_hashes = ()  # nothing needs the prompt any more
        self._plan = []
    def _next(self) -> Action:
        """The next candidate allowed by the plan, or this node, or failure."""
        limit = self.router.config.max_attempts
        while self._plan:
            cand = self._plan.pop(0)
            if cand.target == LOCAL:
                if not self._local_tried:
                    return self._try(cand.target, cand.predicted_match_tokens)
            elif self._peers_tried < limit:
                return self._try(cand.target, cand.predicted_match_tokens)
        if not self._local_tried:
            return self._try(LOCAL, self.router.cache.match(self.tokens, touch=False))
        self._end("failed")
        summary = "; ".join(f"{a.target[:12]}: {a.outcome} {a.message}".strip() for a in self.attempts)
        return Fail("exhausted", f"no candidate could serve the request ({summary})")

    def _try(self, target: str, predicted: int) -> ForwardTo | ServeHere:
        local = target == LOCAL
        self.attempts.append(
            Attempt(self.router.node_id if local else target, local, predicted, resumed_tokens=self.produced)
        )
        if local:
            self._local_tried = True
            return ServeHere(predicted, self.produced)
        self._peers_tried += 1
        return ForwardTo(target, predicted, self.produced)

    def _judge(self, attempt: Attempt, realised: int, now: float) -> list[Action]:
        """A finished forward's realised reuse against its prediction (trust)."""
        if attempt.local or attempt.resumed_tokens:
            return []  # a resumed forward's prompt was not the one predicted
        predicted = attempt.predicted_reused_tokens
        actions: list[Action] = []
        owner = dict(self.decision.vouched_by).get(attempt.target)
        if owner is not None and self.router.on_forward_result(owner, predicted, realised, now):
            self.router.on_peer_gone(owner)
            actions.append(Sanction(owner, f"its directory answer gave {attempt.target[:12]} {predicted} cached prompt tokens "
                                           f"and it reused {realised}"))
        if self.router.on_forward_result(attempt.target, predicted, realised, now):
            self.router.on_peer_gone(attempt.target)
            actions.append(Sanction(attempt.target, f"it advertised {predicted} cached prompt tokens and reused {realised}"))
        return actions
