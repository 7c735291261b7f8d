from __future__ import annotations

import random

from hypothesis import given, strategies as st
import pytest

from p2pinfer.core import LOCAL, BlockHasher, Digest, Load, LocalState, ModelFingerprint, PeerView, RouteRequest, make_policy
from p2pinfer.core.policies import TtftEstimator, CostPolicy, NoCandidateError

FP = ModelFingerprint("m", "t", "c")
H = BlockHasher(FP)
PROMPT = list(range(16 * 64))  # 1,024 tokens
HASHES = H.hashes(PROMPT)
REQ = RouteRequest(len(PROMPT), HASHES, 16)


def view_with(peers: dict[str, tuple[int, int, float]], now: float = 0.0) -> PeerView:
    """peers: id -> (matched blocks, queued tokens, rtt ms)."""
    view = PeerView(FP.hex(), "me")
    for peer, (blocks, queued, rtt) in peers.items():
        view.apply_digest(Digest("full", peer, FP.hex(), 1, 0, frozenset(HASHES[:blocks])), now)
        view.update_load(peer, Load(queued, 4.0), now)
        view.set_rtt(peer, rtt, now)
    return view


def local(match: int = 0, queued: int = 0) -> LocalState:
    return LocalState("me", match, Load(queued, 4.0))


def decide(name: str, view: PeerView, loc: LocalState, now: float = 0.0, seed: int = 1):
    return make_policy(name).decide(REQ, loc, view, now, random.Random(seed))


def test_paper_picks_longest_estimated_match() -> None:
    d = decide("paper", view_with({"a": (10, 0, 1.0), "b": (40, 0, 1.0)}), local())
    assert d.target == "b" and d.predicted_match_tokens == 640
    assert "longest" in d.reason and d.digest_age_s == 0.0


def test_paper_skips_busy_peer_until_backoff_expires() -> None:
    view = view_with({"a": (10, 0, 1.0), "b": (40, 0, 1.0)})
    view.mark_busy("b", 0.0, 2.0)
    assert decide("paper", view, local(), now=1.0).target == "a"
    assert decide("paper", view, local(), now=2.5).target == "b"


def test_paper_prefers_local_on_equal_match() -> None:
    assert decide("paper", view_with({"a": (10, 0, 1.0)}), local(match=160)).target == LOCAL


def test_cost_forwards_to_cached_prefix_on_fast_network() -> None:
    d = decide("cost", view_with({"a": (60, 0, 1.0)}), local())
    assert d.target == "a"
    assert d.candidates[0].est_ttft_ms < d.candidates[-1].est_ttft_ms
    assert LOCAL in d.fallbacks()


def test_cost_stays_local_on_slow_network() -> None:
    # Saving 960 tokens x 4 ms = 3,840 ms is not worth a 5 s round trip.
    d = decide("cost", view_with({"a": (60, 0, 5000.0)}), local())
    assert d.target == LOCAL and "no peer beats" in d.reason


def test_cost_uses_the_relayed_rtt_of_a_relayed_holder() -> None:
    """Routing knows the path (issue 17): when the path to a holder changes
    (a hole-punched connection drops back to the relay), the node resets the
    peer's smoothed RTT and the next measured sample, taken on the relayed
    connection, is the RTT the cost policy uses. The holder saves 960
    tokens x 4 ms = 3,840 ms of prefill: a 200 ms relay detour is worth it,
    a 5 s one is not."""
    for relayed_rtt, expected in ((200.0, "a"), (5000.0, LOCAL)):
        view = view_with({"a": (60, 0, 1.0)})
        for _ in range(20):
            view.set_rtt("a", 1.0, 0.0)  # a long history on the direct path
        assert decide("cost", view, local()).target == "a"
        view.reset_rtt("a")  # the path changed: relayed now
        view.set_rtt("a", relayed_rtt, 0.0)
        assert view.get("a").rtt_ms == relayed_rtt  # not smoothed with the direct path's figure
        d = decide("cost", view, local())
        assert d.target == expected
        assert next(c for c in d.candidates if c.target == "a").rtt_ms == relayed_rtt
    # Without the reset, the direct path's history would hide the detour.
    view = view_with({"a": (60, 0, 1.0)})
    view.set_rtt("a", 5000.0, 0.0)
    assert view.get("a").rtt_ms < 3840 and decide("cost", view, local()).target == "a"


def test_cost_avoids_queue_behind_cached_prefix() -> None:
    # The holder has 2,000 tokens queued (8 s); recomputing here is cheaper.
    d = decide("cost", view_with({"a": (60, 2000, 1.0)}), local())
    assert d.target == LOCAL


def test_cost_escapes_local_queue_to_idle_peer() -> None:
    d = decide("cost", view_with({"idle": (0, 0, 1.0)}), local(queued=5000))
    assert d.target == "idle"


@given(
    local_blocks=st.integers(0, 64),
    peer_blocks=st.integers(0, 64),
    local_q=st.integers(0, 3000),
    peer_q=st.integers(0, 3000),
    rtt=st.floats(0.0, 20_000.0),
    seed=st.integers(0, 10),
)
def test_cost_never_forwards_when_rtt_exceeds_weighted_saving(
    local_blocks: int, peer_blocks: int, local_q: int, peer_q: int, rtt: float, seed: int
) -> None:
    """Forward only when RTT < queue saved + (1 + w) x prefill saved, where w
    is the work weight under contention and 0 in an idle swarm."""
    view = view_with({"a": (peer_blocks, peer_q, rtt), "b": (peer_blocks // 2, peer_q, rtt)})
    loc = local(local_blocks * 16, local_q)
    d = decide("cost", view, loc, seed=seed)
    if d.target != LOCAL:
        chosen = d.candidates[0]
        w = TtftEstimator().work_weight if (local_q or peer_q) else 0.0
        local_prefill = max(1, len(PROMPT) - local_blocks * 16) * 4.0
        saved = (local_q * 4.0 - chosen.queue_ms) + (1 + w) * (local_prefill - chosen.prefill_ms)
        assert chosen.rtt_ms < saved


@given(local_blocks=st.integers(0, 64), peer_blocks=st.integers(0, 64), rtt=st.floats(0.0, 20_000.0), seed=st.integers(0, 10))
def test_idle_swarm_cost_never_forwards_when_rtt_exceeds_prefill_saved(
    local_blocks: int, peer_blocks: int, rtt: float, seed: int
) -> None:
    view = view_with({"a": (peer_blocks, 0, rtt), "b": (peer_blocks // 2, 0, rtt)})
    d = decide("cost", view, local(local_blocks * 16), seed=seed)
    if d.target != LOCAL:
        chosen = d.candidates[0]
        saved = max(1, len(PROMPT) - local_blocks * 16) * 4.0 - chosen.prefill_ms
        assert chosen.rtt_ms < saved


def test_cost_under_contention_forwards_to_queued_holder_instead_of_recomputing() -> None:
    """The holder's queue (2,000 ms) is less than twice the prefill it saves
    (2 x 1,200 ms): greedy TTFT would recompute here, the work weight forwards."""
    view = view_with({"a": (64, 500, 1.0)})  # full match, 500 queued tokens = 2,000 ms
    loc = local(64 * 16 - 300)  # 300 tokens (1,200 ms) to prefill here
    assert decide("cost", view, loc).target == "a"
    greedy = CostPolicy(estimator=TtftEstimator(work_weight=0.0)).decide(REQ, loc, view, 0.0, random.Random(1))
    assert greedy.is_local


def test_cost_near_ties_spread_over_peers() -> None:
    view = view_with({"a": (60, 0, 1.0), "b": (60, 0, 1.0), "c": (60, 0, 1.1)})
    policy = CostPolicy()
    rng = random.Random(3)
    picks = {policy.decide(REQ, local(), view, 0.0, rng).target for _ in range(60)}
    assert picks == {"a", "b", "c"}


def test_other_model_peers_are_never_candidates() -> None:
    view = view_with({"a": (60, 0, 1.0)})
    view.apply_digest(Digest("full", "x", "ffff", 1, 0, frozenset(HASHES)), 0.0)
    for name in ("cost", "paper", "random", "round-robin", "least-loaded", "local"):
        d = decide(name, view, local())
        assert "x" not in [c.target for c in d.candidates]


def test_round_robin_cycles() -> None:
    view = view_with({"a": (0, 0, 1.0), "b": (0, 0, 1.0)})
    policy = make_policy("round-robin")
    rng = random.Random(0)
    targets = [policy.decide(REQ, local(), view, 0.0, rng).target for _ in range(6)]
    assert targets == ["a", "b", LOCAL] * 2


def test_least_loaded_and_local() -> None:
    view = view_with({"a": (0, 300, 1.0), "b": (0, 10, 1.0)})
    assert decide("least-loaded", view, local(queued=100)).target == "b"
    assert decide("local", view, local(queued=100)).target == LOCAL


def test_random_is_seeded() -> None:
    view = view_with({"a": (0, 0, 1.0), "b": (0, 0, 1.0), "c": (0, 0, 1.0)})
    seq1 = [decide("random", view, local(), seed=s).target for s in range(20)]
    seq2 = [decide("random", view, local(), seed=s).target for s in range(20)]
    assert seq1 == seq2 and len(set(seq1)) > 1


def test_no_engine_and_no_peer_is_an_error() -> None:
    with pytest.raises(NoCandidateError):
        decide("cost", PeerView(FP.hex(), "me"), LocalState("me", 0, Load(), can_serve=False))


def test_unknown_policy_named_in_error() -> None:
    with pytest.raises(ValueError, match="unknown policy 'fastest'"):
        make_policy("fastest")


def _reported(slots: int, answers: list[int], now: float) -> Load:
    """The load an engine with ``slots`` slots reports at ``now`` while
    answers of these lengths (decode at 20 ms per token) have been decoding
    since t=0 and their prompts were all cached: the very EngineQueue a live
    engine and a simulated node keep."""
    from p2pinfer.core.engine_queue import EngineQueue

    q = EngineQueue(ms_per_token=4.0, slots=slots, decode_ms_per_token=20.0)
    for i, n in enumerate(answers):
        t = q.admit([i] * 64, cached=64, max_tokens=n)
        q.start(t, 62)
        q.prefilled(t, 2, now=0.0)
    return q.load(now)


def test_cost_prefers_a_free_slot_with_the_prefix_over_queueing_behind_a_long_answer() -> None:
    """Both peers hold most of the prompt and have no prompt queued. ``one``
    (one slot) holds a little more of it but is decoding a 500-token answer
    (10 s left); ``four`` (four slots, two busy) has a slot free now."""
    def pick(now: float) -> str:
        view = view_with({"one": (60, 0, 1.0), "four": (50, 0, 1.0)}, now)
        view.update_load("one", _reported(1, [500], now), now)
        view.update_load("four", _reported(4, [500, 500], now), now)
        return decide("cost", view, local(), now=now).target

    assert _reported(1, [500], 0.0).slot_wait_ms == 10_000.0
    assert _reported(4, [500, 500], 0.0).free_slots == 2
    assert pick(0.0) == "four"
    # the same peers when the long answer is about to end: the longer prefix wins again
    assert pick(9.99) == "one"


# -- like with like: a fresh node's prior against peers' measured speeds (issue 23) --------------


PRIOR_MS = 4.58
"""The calibrated prior a live engine reports before its first timed prefill."""


def _speed_view(peers: dict[str, tuple[int, float, bool]]) -> PeerView:
    """peers: id -> (matched blocks, reported ms/token, whether that speed is measured); RTT 1 ms."""
    view = PeerView(FP.hex(), "me")
    for peer, (blocks, ms, measured) in peers.items():
        view.apply_digest(Digest("full", peer, FP.hex(), 1, 0, frozenset(HASHES[:blocks])), 0.0)
        view.update_load(peer, Load(0, ms, speed_measured=measured), 0.0)
        view.set_rtt(peer, 1.0, 0.0)
    return view


def test_fresh_node_compares_recompute_at_the_peers_measured_speed() -> None:
    """The live failure: the entry node has not timed a prefill yet (it reports
    the 4.58 ms/token prior) and its peer, on the same loaded machine,
    measured 22 ms/token and holds 640 of the 1,024 prompt tokens. At the
    prior, recomputing here (1,024 x 4.58 = 4.7 s) looks cheaper than the
    holder's 384 x 22 = 8.4 s, so the old rule recomputed cold; at the speed
    measured for the same model it costs 22.5 s and the request goes to the
    holder."""
    view = _speed_view({"holder": (40, 22.0, True)})
    fresh = LocalState("me", 0, Load(0, PRIOR_MS, speed_measured=False))
    d = decide("cost", view, fresh)
    assert d.target == "holder" and d.predicted_match_tokens == 640
    local_c = next(c for c in d.candidates if c.target == LOCAL)
    assert local_c.prefill_ms == pytest.approx(1024 * 22.0)
    assert "unmeasured speeds taken as 22.00 ms/token" in d.reason
    # Once it has measured its own speed, that is what it uses: a node that
    # really is 4.58 ms/token recomputes here.
    d = decide("cost", view, LocalState("me", 0, Load(0, PRIOR_MS)))
    assert d.target == LOCAL and "unmeasured" not in d.reason


def test_unmeasured_speed_is_the_median_of_the_measured_ones() -> None:
    # each holds a block, so all four are candidates (not only the 3 cheapest spare peers)
    view = _speed_view({"a": (1, 10.0, True), "b": (1, 30.0, True), "c": (1, 20.0, True), "new": (1, PRIOR_MS, False)})
    fresh = LocalState("me", 0, Load(0, PRIOR_MS, speed_measured=False))
    d = decide("cost", view, fresh)
    by_target = {c.target: c.prefill_ms for c in d.candidates}
    assert by_target[LOCAL] == pytest.approx(1024 * 20.0)
    assert by_target["new"] == pytest.approx(1008 * 20.0)  # an unmeasured peer is not the fastest either
    assert by_target["a"] == pytest.approx(1008 * 10.0)


def test_measured_node_does_not_send_cold_work_to_a_fresh_peer_for_its_prior() -> None:
    """The mirror case: this node measured 22 ms/token; a fresh peer holding
    nothing still reports the prior. At face value the peer would look five
    times faster and take every cold request; like with like it does not."""
    view = _speed_view({"fresh": (0, PRIOR_MS, False)})
    d = decide("cost", view, LocalState("me", 0, Load(0, 22.0)))
    assert d.target == LOCAL


def test_without_any_measurement_every_candidate_keeps_its_prior() -> None:
    view = _speed_view({"holder": (40, PRIOR_MS, False)})
    d = decide("cost", view, LocalState("me", 0, Load(0, PRIOR_MS, speed_measured=False)))
    local_c = next(c for c in d.candidates if c.target == LOCAL)
    assert local_c.prefill_ms == pytest.approx(1024 * PRIOR_MS)
    assert d.target == "holder" and "unmeasured" not in d.reason
