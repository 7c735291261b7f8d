"""Routing policies: where should this request be served?

A policy is a pure function of (the request's block hashes, the local
node's state, the peer view, the time, a seeded RNG) to a :class:`Decision`
that explains itself. The live node and the simulator call the very same
objects. Candidates after the chosen one are the fallbacks, in order, for
when the chosen peer refuses (BUSY) or dies.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
import random
import statistics
from typing import Protocol

from .peers import Load, PeerState, PeerView

__all__ = [
    "LOCAL",
    "POLICIES",
    "Candidate",
    "CostPolicy",
    "Decision",
    "LeastLoadedPolicy",
    "LocalPolicy",
    "LocalState",
    "PaperPolicy",
    "Policy",
    "RandomPolicy",
    "RoundRobinPolicy",
    "RouteRequest",
    "make_policy",
    "reference_speed",
]

LOCAL = "local"
"""Target name of the node that received the request."""


@dataclass(frozen=True, slots=True)
class RouteRequest:
    prompt_tokens: int
    block_hashes: Sequence[int]
    block_size: int


@dataclass(slots=True)
class LocalState:
    """The deciding node itself: exact, not estimated."""

    node_id: str
    match_tokens: int
    """Exact longest prefix the local engine holds (token precision)."""
    load: Load
    can_serve: bool = True
    """False for a node without an engine (a pure entry point)."""


@dataclass(frozen=True, slots=True)
class Candidate:
    target: str
    """:data:`LOCAL` or a peer id."""
    predicted_match_tokens: int
    est_ttft_ms: float
    rtt_ms: float = 0.0
    queue_ms: float = 0.0
    prefill_ms: float = 0.0
    digest_age_s: float | None = None
    score_ms: float | None = None
    """What ``cost`` ranks by: ``est_ttft_ms`` plus ``work_weight`` x prefill
    (see :class:`TtftEstimator`); ``None`` means ``est_ttft_ms``."""

    @property
    def score(self) -> float:
        return self.est_ttft_ms if self.score_ms is None else self.score_ms


@dataclass(frozen=True, slots=True)
class Decision:
    policy: str
    target: str
    predicted_match_tokens: int
    reason: str
    candidates: tuple[Candidate, ...] = ()
    """Ranked, the chosen one first; the rest are fallbacks."""
    digest_age_s: float | None = None
    est_ttft_ms: float | None = None
    vouched_by: tuple[tuple[str, str], ...] = ()
    """``(candidate, directory owner)``: candidates whose predicted match an
    owner's answer gave (:func:`~p2pinfer.core.directory.vouched_by`); a
    shortfall there counts against the owner too."""

    @property
    def is_local(self) -> bool:
        return self.target == LOCAL

    def fallbacks(self) -> list[str]:
        return [c.target for c in self.candidates[1:]]

    def as_dict(self) -> dict[str, object]:
        return {
            "policy": self.policy,
            "target": self.target,
            "predicted_match_tokens": self.predicted_match_tokens,
            "reason": self.reason,
            "digest_age_s": self.digest_age_s,
            "est_ttft_ms": self.est_ttft_ms,
            "candidates": [
                {
                    "target": c.target,
                    "predicted_match_tokens": c.predicted_match_tokens,
                    "est_ttft_ms": round(c.est_ttft_ms, 3),
                    "rtt_ms": c.rtt_ms,
                    "queue_ms": round(c.queue_ms, 3),
                    "prefill_ms": round(c.prefill_ms, 3),
                }
                for c in self.candidates
            ],
        }


class Policy(Protocol):
    name: str

    def decide(
        self,
        request: RouteRequest,
        local: LocalState,
        view: PeerView,
        now: float,
        rng: random.Random,
    ) -> Decision: ...


# -- shared helpers -----------------------------------------------------------


@dataclass(slots=True)
class TtftEstimator:
    """Estimated time to first token on a candidate, in milliseconds.

    ``rtt + wait + uncached tokens x ms/token``, the wait being
    :meth:`Load.wait_ms` (queued prompt tokens x ms/token, or the wait for
    a free slot behind answers being decoded, whichever is longer); the
    same formula for every candidate so that the local node (RTT 0, exact
    match) and peers (gossiped match and load) compare fairly.
    """

    default_rtt_ms: float = 5.0
    """Assumed for a peer whose RTT was never measured."""
    stale_load_s: float = 30.0
    """Reported load older than this is ignored (assumed idle)."""
    work_weight: float = 1.0
    """Extra weight of the prefill work a candidate would do, on top of the
    request's own wait for it: work done also delays whoever queues behind
    it. 0 ranks by time to first token alone (greedy per request). The
    simulator found that greedy recomputes cold whenever the prefix holder
    has a queue, and at 0.5 req/s per node (4 nodes, MMLU) that extra work
    saturated the swarm (mean TTFT 19 s) where a weight of 1 kept it at
    1.8 s; on a live swarm whose nodes share CPU cores the cold recompute
    also slows the holder itself (docs/results.md, issues 6 and 7)."""
    work_only_under_contention: bool = True
    """Apply ``work_weight`` only when some candidate has queued work. In an
    idle swarm nobody waits behind the work, so the rule stays greedy there:
    it never forwards across a round trip longer than the prefill it saves.
    Under contention it forwards across round trips up to ``1 +
    work_weight`` times the prefill saved."""
    drain_reported_queue: bool = True
    """A peer has been working through its reported queue since it reported
    it (one request at a time, at its prefill speed): subtract that work.
    Without it a 1 s old report overstates a busy peer's queue by up to
    1 s, and cold local recomputes replace cheap forwards (simulator,
    docs/results.md, issue 6)."""

    def candidate(
        self,
        target: str,
        prompt_tokens: int,
        match_tokens: int,
        load: Load,
        rtt_ms: float,
        digest_age_s: float | None = None,
    ) -> Candidate:
        # A full hit still prefills the last token to produce the first output.
        uncached = max(1, prompt_tokens - match_tokens)
        ms = load.prefill_ms_per_token
        queue_ms = load.wait_ms()
        prefill_ms = uncached * ms
        est = rtt_ms + queue_ms + prefill_ms
        return Candidate(
            target=target,
            predicted_match_tokens=match_tokens,
            est_ttft_ms=est,
            rtt_ms=rtt_ms,
            queue_ms=queue_ms,
            prefill_ms=prefill_ms,
            digest_age_s=digest_age_s,
        )

    def weigh_work(self, candidates: list[Candidate]) -> list[Candidate]:
        """Give each candidate its ranking score (see ``work_weight``)."""
        w = self.work_weight
        if not w or (self.work_only_under_contention and not any(c.queue_ms > 0 for c in candidates)):
            return candidates
        return [replace(c, score_ms=c.est_ttft_ms + w * c.prefill_ms) for c in candidates]


def _eligible(view: PeerView, now: float) -> list[PeerState]:
    """Every peer that may receive work now (O(peers): baselines only)."""
    return [p for p in view if view.eligible(p, now)]


def reference_speed(loads: Iterable[Load]) -> float | None:
    """The median prefill speed among ``loads`` that measured theirs (None: none did).

    Why (issue 23): a fresh live node reports its engine's calibrated prior
    (``EngineCostModel``'s, from an idle machine) until its first timed prefill,
    while its peers report what they measured, on a loaded or slow machine
    several times that. Comparing the prior here with a measurement there
    made ``cost`` recompute a long prefix cold rather than forward it to the
    peer that holds it ("no peer beats recompute here (1113.6 ms) by 55.7
    ms" in a live two-process run). A candidate without a measurement is
    therefore estimated at the speed its rivals measured for the same model
    (every peer in a view serves the view's fingerprint): like with like. On
    identical machines that is the right speed; on mixed ones it is wrong
    for one request at most, since the node's first timed prefill replaces
    it. With no measurement anywhere every candidate keeps its prior. A
    start-up probe (timing a 64-token prefill) was tried instead and
    overestimated the speed five-fold (per-call overhead, warm-up)."""
    speeds = sorted(load.prefill_ms_per_token for load in loads if load.speed_measured)
    return statistics.median(speeds) if speeds else None


def _like_with_like(load: Load, reference: float | None) -> Load:
    """``load`` with its speed set to ``reference`` when it measured none (see :func:`reference_speed`)."""
    if load.speed_measured or reference is None:
        return load
    return replace(load, prefill_ms_per_token=reference)


def _matched_peers(request: RouteRequest, view: PeerView, now: float, spare: int) -> list[tuple[PeerState, int]]:
    """Eligible peers holding a prefix (with their match in tokens), plus the ``spare`` cheapest others.

    O(prompt blocks x matching peers + spare): never a scan of the view.
    """
    out: list[tuple[PeerState, int]] = []
    matches = _peer_matches(request, view)
    for peer_id, match in matches.items():
        peer = view.get(peer_id)
        if peer is not None and view.eligible(peer, now):
            out.append((peer, match))
    for peer in view.cheapest_peers(spare, now, exclude=matches.keys()):
        out.append((peer, 0))
    return out


def _peer_matches(request: RouteRequest, view: PeerView) -> dict[str, int]:
    blocks = view.longest_matches(request.block_hashes)
    return {peer: n * request.block_size for peer, n in blocks.items()}


def _peer_load(estimator: TtftEstimator, peer: PeerState, now: float) -> Load:
    """What the peer's load is believed to be now: its report, aged (see :class:`TtftEstimator`)."""
    load = peer.load
    if peer.load_at is None or now - peer.load_at > estimator.stale_load_s:
        return replace(load, queued_prefill_tokens=0, active_requests=0, free_slots=load.slots, slot_wait_ms=0.0)
    if estimator.drain_reported_queue and now > peer.load_at and load.prefill_ms_per_token > 0:
        elapsed_ms = (now - peer.load_at) * 1000.0
        drained = int(elapsed_ms / load.prefill_ms_per_token)
        if drained or load.slot_wait_ms:
            load = replace(
                load,
                queued_prefill_tokens=max(0, load.queued_prefill_tokens - drained),
                slot_wait_ms=max(0.0, load.slot_wait_ms - elapsed_ms),
            )
    return load


def _candidates(
    estimator: TtftEstimator,
    request: RouteRequest,
    local: LocalState | None,
    peers: Sequence[tuple[PeerState, int]],
    now: float,
) -> tuple[list[Candidate], float | None]:
    """The peers' candidates, then the local node's (``local``: None when it
    cannot serve), speeds compared like with like (:func:`reference_speed`).
    Also returns the speed given to candidates that measured none (None: no
    candidate's speed was replaced)."""
    loads = [(peer, match, _peer_load(estimator, peer, now)) for peer, match in peers]
    everyone = [load for _, _, load in loads] + ([] if local is None else [local.load])
    reference = reference_speed(everyone)
    replaced = reference if reference is not None and not all(load.speed_measured for load in everyone) else None
    out = [
        estimator.candidate(
            peer.peer_id,
            request.prompt_tokens,
            match,
            _like_with_like(load, reference),
            estimator.default_rtt_ms if peer.rtt_ms is None else peer.rtt_ms,
            peer.digest_age(now),
        )
        for peer, match, load in loads
    ]
    if local is not None:
        out.append(
            estimator.candidate(LOCAL, request.prompt_tokens, local.match_tokens, _like_with_like(local.load, reference), 0.0)
        )
    return out, replaced


def _decision(name: str, ranked: list[Candidate], reason: str) -> Decision:
    best = ranked[0]
    return Decision(
        policy=name,
        target=best.target,
        predicted_match_tokens=best.predicted_match_tokens,
        reason=reason,
        candidates=tuple(ranked),
        digest_age_s=best.digest_age_s,
        est_ttft_ms=best.est_ttft_ms,
    )


def _all_candidates(
    estimator: TtftEstimator, request: RouteRequest, local: LocalState, view: PeerView, now: float
) -> list[Candidate]:
    matches = _peer_matches(request, view)
    peers = [(p, matches.get(p.peer_id, 0)) for p in _eligible(view, now)]
    return _candidates(estimator, request, local if local.can_serve else None, peers, now)[0]


# -- policies -------------------------------------------------------------------


@dataclass
class CostPolicy:
    """Minimise estimated time to first token over the local node and peers.

    Forwards only when a peer's score beats local recompute by more than
    ``tie_ms`` *and* ``tie_ratio``; so on a slow network (RTT above the
    prefill it would save, or ``1 + work_weight`` times it under
    contention: see :class:`TtftEstimator`) it serves locally and degrades to
    ``local``.
    Among near-ties it picks at random (weighted towards the cheaper) so
    that many origins do not herd onto one peer. A candidate that has not
    measured its speed yet (a fresh node, itself included) is estimated at
    its rivals' measured speed (:func:`reference_speed`).
    """

    estimator: TtftEstimator = field(default_factory=TtftEstimator)
    tie_ms: float = 2.0
    tie_ratio: float = 0.05
    spare_peers: int = 3
    """Unmatched peers considered (cheapest RTT + queue first)."""
    name: str = "cost"

    def decide(
        self, request: RouteRequest, local: LocalState, view: PeerView, now: float, rng: random.Random
    ) -> Decision:
        # Unmatched peers can only win on queue time; a few cheapest suffice.
        peers = _matched_peers(request, view, now, self.spare_peers)
        cands, borrowed = _candidates(self.estimator, request, local if local.can_serve else None, peers, now)
        speed_note = "" if borrowed is None else f"; unmeasured speeds taken as {borrowed:.2f} ms/token (median measured)"
        ranked = sorted(self.estimator.weigh_work(cands), key=lambda c: (c.score, c.target))
        if not ranked:
            raise NoCandidateError("no peer can serve and this node has no engine")
        local_c = next((c for c in ranked if c.target == LOCAL), None)
        if local_c is not None:
            # Forwarding must be clearly cheaper than recomputing here.
            margin = max(self.tie_ms, self.tie_ratio * local_c.score)
            better = [c for c in ranked if c.target != LOCAL and c.score + margin < local_c.score]
            if not better:
                rest = [c for c in ranked if c.target != LOCAL]
                return _decision(
                    self.name,
                    [local_c, *rest],
                    f"local: no peer beats recompute here ({local_c.est_ttft_ms:.1f} ms) by {margin:.1f} ms{speed_note}",
                )
            worse = [c for c in ranked if c.target != LOCAL and c.score + margin >= local_c.score]
            ranked = better + [local_c] + worse
        else:
            better = ranked
        best = ranked[0]
        band = max(self.tie_ms, self.tie_ratio * best.score)
        # Only peers that already beat local recompute may share the tie.
        ties = [c for c in better if c.score <= best.score + band]
        if len(ties) > 1:
            weights = [1.0 / (1.0 + c.score - best.score) for c in ties]
            pick = rng.choices(ties, weights=weights, k=1)[0]
            ranked = [pick] + [c for c in ranked if c is not pick]
        chosen = ranked[0]
        reason = (
            f"{'local' if chosen.target == LOCAL else 'forward'}: est TTFT {chosen.est_ttft_ms:.1f} ms "
            f"(rtt {chosen.rtt_ms:.1f} + queue {chosen.queue_ms:.1f} + prefill {chosen.prefill_ms:.1f}), "
            f"match {chosen.predicted_match_tokens}/{request.prompt_tokens} tokens"
            + (f", {len(ties)} near-ties" if len(ties) > 1 else "")
            + speed_note
        )
        return _decision(self.name, ranked, reason)


class NoCandidateError(RuntimeError):
    """Nobody can serve: no engine here and no eligible peer."""


@dataclass
class PaperPolicy:
    """The paper's rule: longest estimated prefix match; busy peers skipped.

    Ties (including "nobody matches") go to the local node when it can
    serve, else to a random eligible peer.
    """

    estimator: TtftEstimator = field(default_factory=TtftEstimator)
    name: str = "paper"

    def decide(
        self, request: RouteRequest, local: LocalState, view: PeerView, now: float, rng: random.Random
    ) -> Decision:
        peers = _matched_peers(request, view, now, spare=3)
        cands = _candidates(self.estimator, request, local if local.can_serve else None, peers, now)[0]
        if not cands:
            raise NoCandidateError("no peer can serve and this node has no engine")
        best_match = max(c.predicted_match_tokens for c in cands)
        top = [c for c in cands if c.predicted_match_tokens == best_match]
        local_top = [c for c in top if c.target == LOCAL]
        chosen = local_top[0] if local_top else rng.choice(sorted(top, key=lambda c: c.target))
        rest = sorted((c for c in cands if c is not chosen), key=lambda c: -c.predicted_match_tokens)
        reason = f"longest estimated match {best_match}/{request.prompt_tokens} tokens"
        return _decision(self.name, [chosen, *rest], reason)


@dataclass
class RandomPolicy:
    estimator: TtftEstimator = field(default_factory=TtftEstimator)
    name: str = "random"

    def decide(
        self, request: RouteRequest, local: LocalState, view: PeerView, now: float, rng: random.Random
    ) -> Decision:
        cands = sorted(_all_candidates(self.estimator, request, local, view, now), key=lambda c: c.target)
        if not cands:
            raise NoCandidateError("no peer can serve and this node has no engine")
        rng.shuffle(cands)
        return _decision(self.name, cands, "uniform random choice")


@dataclass
class RoundRobinPolicy:
    """Cycles over the local node and the eligible peers in id order."""

    estimator: TtftEstimator = field(default_factory=TtftEstimator)
    name: str = "round-robin"
    _next: int = 0

    def decide(
        self, request: RouteRequest, local: LocalState, view: PeerView, now: float, rng: random.Random
    ) -> Decision:
        cands = sorted(_all_candidates(self.estimator, request, local, view, now), key=lambda c: c.target)
        if not cands:
            raise NoCandidateError("no peer can serve and this node has no engine")
        i = self._next % len(cands)
        self._next += 1
        return _decision(self.name, cands[i:] + cands[:i], f"round robin slot {i} of {len(cands)}")


@dataclass
class LeastLoadedPolicy:
    """Fewest queued prefill tokens (by estimated queue time); ties random."""

    estimator: TtftEstimator = field(default_factory=TtftEstimator)
    name: str = "least-loaded"

    def decide(
        self, request: RouteRequest, local: LocalState, view: PeerView, now: float, rng: random.Random
    ) -> Decision:
        cands = _all_candidates(self.estimator, request, local, view, now)
        if not cands:
            raise NoCandidateError("no peer can serve and this node has no engine")
        keyed = [(c.queue_ms, rng.random(), c) for c in cands]
        keyed.sort(key=lambda t: (t[0], t[1]))
        ranked = [c for _, _, c in keyed]
        return _decision(self.name, ranked, f"least queued work ({ranked[0].queue_ms:.1f} ms)")


@dataclass
class LocalPolicy:
    """Serve where the request arrived; peers only as fallbacks if it cannot."""

    estimator: TtftEstimator = field(default_factory=TtftEstimator)
    name: str = "local"

    def decide(
        self, request: RouteRequest, local: LocalState, view: PeerView, now: float, rng: random.Random
    ) -> Decision:
        cands = sorted(_all_candidates(self.estimator, request, local, view, now), key=lambda c: c.target != LOCAL)
        if not cands:
            raise NoCandidateError("no peer can serve and this node has no engine")
        return _decision(self.name, cands, "serve where the request arrived")


POLICIES: dict[str, Callable[[], Policy]] = {
    "cost": CostPolicy,
    "paper": PaperPolicy,
    "random": RandomPolicy,
    "round-robin": RoundRobinPolicy,
    "least-loaded": LeastLoadedPolicy,
    "local": LocalPolicy,
}


def make_policy(name: str) -> Policy:
    """A fresh policy by name (see :data:`POLICIES`)."""
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}") from None
