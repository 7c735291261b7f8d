from __future__ import annotations

from p2pinfer.core import LOCAL, Load, ModelFingerprint, RadixTree, Router

FP = ModelFingerprint("m", "t", "c")
PROMPT = list(range(1, 16 * 20 + 1))


def pair() -> tuple[Router, Router]:
    a = Router("a", FP, RadixTree(), seed=1)
    b = Router("b", FP, RadixTree(), seed=2)
    return a, b


def test_views_follow_deltas_and_full_digests() -> None:
    a, b = pair()
    a.cache.insert(PROMPT)
    delta = a.take_delta()
    assert delta is not None and a.take_delta() is None  # nothing new since
    assert b.on_digest_bytes(delta, 1.0) == "applied"
    b.on_load("a", Load(0, 4.0), False, 1.0)
    decision, hashes = b.route(PROMPT, Load(0, 4.0), 1.0)
    assert decision.target == "a" and decision.predicted_match_tokens == 320 and len(hashes) == 20
    # Eviction on a shows up in b's view after the next delta.
    a.cache.evict(0)
    assert b.on_digest_bytes(a.take_delta() or b"", 2.0) == "applied"
    assert b.route(PROMPT, Load(0, 4.0), 2.0)[0].target == LOCAL


def test_lost_delta_heals_with_full_digest() -> None:
    a, b = pair()
    a.cache.insert(PROMPT)
    b.on_digest_bytes(a.take_delta() or b"", 1.0)
    a.cache.insert([9] * 64)
    a.take_delta()  # lost
    a.cache.insert([8] * 64)
    assert b.on_digest_bytes(a.take_delta() or b"", 2.0) == "gap"
    assert b.on_digest_bytes(a.full_digest(), 3.0) == "applied"
    state = b.view.get("a")
    assert state is not None and state.hashes == a.tracker.hashes


def test_own_digest_is_ignored() -> None:
    a, _ = pair()
    a.cache.insert(PROMPT)
    assert a.on_digest_bytes(a.full_digest(), 0.0) == "stale"
    assert "a" not in a.view


def test_busy_signal_backs_off() -> None:
    a, b = pair()
    a.cache.insert(PROMPT)
    b.on_digest_bytes(a.full_digest(), 0.0)
    b.on_load("a", Load(0, 4.0), True, 0.0)
    assert b.route(PROMPT, Load(0, 4.0), 1.0)[0].target == LOCAL
    assert b.route(PROMPT, Load(0, 4.0), 2.5)[0].target == "a"
    b.on_busy_refusal("a", 3.0)
    assert b.route(PROMPT, Load(0, 4.0), 4.0)[0].target == LOCAL


def test_overclaiming_peer_loses_trust_then_recovers() -> None:
    a, b = pair()
    a.cache.insert(PROMPT)
    b.on_digest_bytes(a.full_digest(), 0.0)
    b.on_load("a", Load(0, 4.0), False, 0.0)
    mispredictions = 0
    while b.route(PROMPT, Load(0, 4.0), 1.0)[0].target == "a":
        mispredictions += 1
        assert mispredictions <= 20
        b.on_forward_result("a", predicted=320, realised=0, now=1.0)
    assert 1 <= mispredictions <= 5
    # Honest results do not cost trust.
    _, c = pair()
    c.on_digest_bytes(a.full_digest(), 0.0)
    for _ in range(50):
        assert not c.on_forward_result("a", predicted=320, realised=320, now=1.0)
    # After the penalty the peer is heard again (with a fresh digest).
    b.on_digest_bytes(a.full_digest(), 200.0)
    b.on_load("a", Load(0, 4.0), False, 200.0)
    assert b.route(PROMPT, Load(0, 4.0), 200.0)[0].target == "a"


def test_busy_threshold() -> None:
    a, _ = pair()
    assert not a.over_busy_queue(Load(100, 4.0))
    assert a.over_busy_queue(Load(5000, 4.0))  # 20 s of queued prefill


def test_a_prompt_in_service_is_listed_until_it_ends_and_stays_if_cached() -> None:
    a, b = pair()
    in_service = a.begin_serving(PROMPT)
    b.on_digest_bytes(a.take_delta() or b"", 1.0)
    b.on_load("a", Load(0, 4.0), False, 1.0)
    decision, _ = b.route(PROMPT, Load(0, 4.0), 1.0)
    # Not cached yet, but a serves it: a request queued behind it reuses it.
    assert decision.target == "a" and decision.predicted_match_tokens == 320
    a.cache.insert(PROMPT)
    a.end_serving(in_service)
    assert a.take_delta() is None  # cached now: nothing to withdraw
    a.cache.evict(0)
    b.on_digest_bytes(a.take_delta() or b"", 2.0)
    assert b.route(PROMPT, Load(0, 4.0), 2.0)[0].target == LOCAL


def test_a_failed_prompt_is_withdrawn_and_two_of_them_count_twice() -> None:
    a, b = pair()
    first, second = a.begin_serving(PROMPT), a.begin_serving(PROMPT[:160])
    a.end_serving(first)  # failed: never cached
    b.on_digest_bytes(a.take_delta() or b"", 1.0)
    state = b.view.get("a")
    assert state is not None and len(state.hashes) == 10  # the second still holds its 10 blocks
    a.end_serving(second)
    b.on_digest_bytes(a.take_delta() or b"", 2.0)
    assert not b.view.get("a").hashes  # type: ignore[union-attr]
    assert a.tracker.hashes == frozenset()


def test_the_local_match_counts_a_prompt_this_node_serves() -> None:
    a, _ = pair()
    assert a.route(PROMPT, Load(0, 4.0), 1.0)[0].predicted_match_tokens == 0
    a.begin_serving(PROMPT[:100])  # 6 whole blocks of 16
    decision, _ = a.route(PROMPT, Load(0, 4.0), 1.0)
    assert decision.target == LOCAL and decision.predicted_match_tokens == 96
