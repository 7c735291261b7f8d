from __future__ import annotations

import pytest

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


# -- the announce schedule (issue 14) ------------------------------------------------------------
def test_gossip_config_refuses_a_ttl_shorter_than_two_keepalives() -> None:
    from p2pinfer.core.router import GossipConfig

    GossipConfig(keepalive_interval_s=2.0, peer_ttl_s=4.0)
    with pytest.raises(ValueError, match="twice keepalive"):
        GossipConfig(keepalive_interval_s=2.0, peer_ttl_s=3.9)
    with pytest.raises(ValueError, match="at least load_interval"):
        GossipConfig(load_interval_s=2.0, keepalive_interval_s=1.0)
    with pytest.raises(ValueError, match="positive"):
        GossipConfig(delta_interval_s=0.0)


def test_an_idle_node_announces_its_load_only_as_a_keepalive() -> None:
    from p2pinfer.core.peers import Load
    from p2pinfer.core.router import AnnounceSchedule, GossipConfig

    cfg = GossipConfig(load_interval_s=1.0, keepalive_interval_s=10.0, peer_ttl_s=30.0)
    s = AnnounceSchedule(cfg)
    idle = Load(0, 4.0, 0)
    assert s.load_due(idle, False, 0.0)  # the first report always goes out
    s.load_sent(idle, False, 0.0)
    # Nothing new: silent until the keep-alive, however often it is asked.
    assert [t for t in (0.5, 1.0, 2.0, 5.0, 9.99) if s.load_due(idle, False, t)] == []
    assert s.load_due(idle, False, 10.0)
    s.load_sent(idle, False, 10.0)
    # A change goes out at the next load interval, not before.
    assert not s.load_due(Load(0, 5.0, 0), False, 10.5)
    assert s.load_due(Load(0, 5.0, 0), False, 11.0)
    # So does a change of anything else the report carries (addresses).
    assert s.load_due(idle, False, 11.0, ("/ip4/10.0.0.2/tcp/4001",))


def test_a_working_node_reports_every_interval_and_a_busy_flip_at_once() -> None:
    from p2pinfer.core.peers import Load
    from p2pinfer.core.router import AnnounceSchedule, GossipConfig

    s = AnnounceSchedule(GossipConfig())
    working = Load(300, 4.0, 1)
    s.load_sent(working, False, 0.0)
    # Unchanged, but with work: its timestamp is news (peers drain a reported queue by its age).
    assert not s.load_due(working, False, 0.9)
    assert s.load_due(working, False, 1.0)
    assert s.load_due(Load(0, 4.0, 1), False, 1.0)  # active requests count as work
    # The hotspot valve does not wait for the interval.
    assert s.load_due(working, True, 0.01)
    s.load_sent(working, True, 0.01)
    assert s.load_due(working, False, 0.02)


def test_a_full_digest_goes_out_only_when_the_digest_changed() -> None:
    from p2pinfer.core.router import AnnounceSchedule, GossipConfig

    s = AnnounceSchedule(GossipConfig())
    assert s.full_due(7, 0)
    s.full_sent(7, 0)
    assert not s.full_due(7, 0)
    assert s.full_due(7, 1)
    s.full_sent(7, 1)
    assert not s.full_due(7, 1)
    assert s.full_due(8, 1)  # a new epoch (restart) too


def test_the_schedule_says_when_the_next_load_report_falls_due() -> None:
    from p2pinfer.core.peers import Load
    from p2pinfer.core.router import AnnounceSchedule, GossipConfig

    s = AnnounceSchedule(GossipConfig(load_interval_s=1.0, keepalive_interval_s=10.0, peer_ttl_s=30.0))
    assert s.next_load_at(Load()) == float("-inf")  # never sent: now
    s.load_sent(Load(0, 4.0, 0), False, 100.0)
    assert s.next_load_at(Load(0, 4.0, 0)) == 110.0  # idle, unchanged: the keep-alive
    assert s.next_load_at(Load(0, 4.5, 0)) == 101.0  # changed: the next interval
    assert s.next_load_at(Load(10, 4.0, 1)) == 101.0  # working


def test_an_idle_node_whose_peers_are_all_directly_connected_sends_no_keepalive() -> None:
    """Issue 14: a directly connected peer probes us instead, so the idle keep-alive
    is only for peers that hear of us through gossip alone; news still goes out."""
    from p2pinfer.core.peers import Load
    from p2pinfer.core.router import AnnounceSchedule, GossipConfig

    s = AnnounceSchedule(GossipConfig(load_interval_s=1.0, keepalive_interval_s=10.0, peer_ttl_s=30.0))
    idle = Load(0, 4.0, 0)
    assert s.load_due(idle, False, 0.0, keepalive=False)  # the first report always goes out
    s.load_sent(idle, False, 0.0, (7, 3))
    assert [t for t in (10.0, 60.0, 3600.0) if s.load_due(idle, False, t, (7, 3), keepalive=False)] == []
    assert s.next_load_at(idle, (7, 3), keepalive=False) == float("inf")
    assert s.load_due(idle, False, 3600.0, (7, 3))  # a peer that is not directly connected: due again
    assert s.load_due(idle, True, 5.0, (7, 3), keepalive=False)  # a busy flip at once
    assert s.load_due(Load(0, 4.0, 1), False, 5.0, (7, 3), keepalive=False)  # work
    # A new digest version (what the report names) is news: a peer that missed it learns it.
    assert not s.load_due(idle, False, 0.5, (7, 4), keepalive=False)
    assert s.load_due(idle, False, 1.0, (7, 4), keepalive=False)
    assert s.next_load_at(idle, (7, 4), keepalive=False) == 1.0
