"""Core changes of issue 6: queue drain with report age; the work weight."""

from __future__ import annotations

import random

from p2pinfer.core import BlockHasher, CostPolicy, Digest, Load, LocalState, ModelFingerprint, PeerView, RouteRequest
from p2pinfer.core.policies import TtftEstimator

FP = ModelFingerprint("m", "t", "c")
PROMPT = list(range(1, 16 * 40 + 1))


def setup(drain: bool) -> tuple[CostPolicy, PeerView, RouteRequest]:
    hasher = BlockHasher(FP)
    hashes = hasher.hashes(PROMPT)
    view = PeerView(FP.hex(), "self")
    view.apply_digest(Digest("full", "peer", FP.hex(), 1, 0, frozenset(hashes)), 0.0)
    view.update_load("peer", Load(1000, 4.0, 2), 0.0)  # 4 s of queued prefill, reported at t=0
    view.set_rtt("peer", 2.0, 0.0)
    policy = CostPolicy(estimator=TtftEstimator(drain_reported_queue=drain, work_weight=0.0))  # the drain alone
    return policy, view, RouteRequest(len(PROMPT), hashes, 16)


def test_a_busy_peer_becomes_attractive_as_its_report_ages() -> None:
    policy, view, request = setup(drain=True)
    local = LocalState("self", 0, Load(0, 4.0, 0))  # cold here: 2,560 ms
    at_report = policy.decide(request, local, view, 0.0, random.Random(1))
    assert at_report.is_local  # 4,000 ms of queue + 4 ms beats nothing
    later = policy.decide(request, local, view, 3.0, random.Random(1))
    assert later.target == "peer" and later.candidates[0].queue_ms == 1000 * 4.0 - 3000.0


def test_drain_can_be_switched_off_and_never_goes_negative() -> None:
    policy, view, request = setup(drain=False)
    local = LocalState("self", 0, Load(0, 4.0, 0))
    assert policy.decide(request, local, view, 3.0, random.Random(1)).is_local
    policy, view, request = setup(drain=True)
    d = policy.decide(request, local, view, 20.0, random.Random(1))
    assert d.target == "peer" and d.candidates[0].queue_ms == 0


def test_work_weight_counts_prefill_work_twice() -> None:
    """The holder saves 2,400 ms of prefill at an RTT of 3,000 ms."""
    hasher = BlockHasher(FP)
    hashes = hasher.hashes(PROMPT)
    view = PeerView(FP.hex(), "self")
    view.apply_digest(Digest("full", "peer", FP.hex(), 1, 0, frozenset(hashes)), 0.0)
    view.update_load("peer", Load(0, 4.0, 0), 0.0)
    view.set_rtt("peer", 3000.0, 0.0)
    request = RouteRequest(len(PROMPT), hashes, 16)
    local = LocalState("self", 40, Load(0, 4.0, 0))  # 600 of 640 tokens to prefill here
    greedy = CostPolicy(estimator=TtftEstimator(work_weight=0.0)).decide(request, local, view, 0.0, random.Random(1))
    assert greedy.is_local
    # In an idle swarm the default (weight under contention only) stays greedy.
    assert CostPolicy().decide(request, local, view, 0.0, random.Random(1)).is_local
    always = TtftEstimator(work_weight=1.0, work_only_under_contention=False)
    weighted = CostPolicy(estimator=always).decide(request, local, view, 0.0, random.Random(1))
    assert weighted.target == "peer"
    assert weighted.est_ttft_ms == weighted.candidates[0].est_ttft_ms == 3000.0 + 4.0  # still a TTFT estimate
    assert weighted.candidates[0].score == 3000.0 + 2 * 4.0
