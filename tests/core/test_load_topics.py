"""Load topics (p2pinfer/core/load_topics.py): the count, the hash, the names, the moves."""

from __future__ import annotations

from collections import Counter
import hashlib

import base58
import pytest

from p2pinfer.core.load_topics import (
    LoadTopicState,
    load_topic_name,
    parse_load_topic,
    topic_count,
    topic_index,
    topic_of,
)
from p2pinfer.sim.model import sim_peer_id

FP = "ab" * 32


@pytest.mark.parametrize(
    ("estimate", "count"),
    [(1, 1), (8, 1), (11, 1), (12, 2), (16, 2), (22, 2), (23, 4), (32, 4), (45, 4), (46, 8), (256, 32), (1020, 128), (1024, 128)],
)
def test_the_count_is_the_power_of_two_nearest_in_ratio(estimate: int, count: int) -> None:
    # 8 per topic: 1 topic up to 8 * sqrt 2 = 11.3 nodes, 2 up to 22.6, 4 up to 45.3.
    assert topic_count(estimate, 8) == count


def test_the_count_is_at_least_one_and_a_power_of_two_everywhere() -> None:
    for per in (1, 3, 8):
        for estimate in range(0, 3000, 7):
            c = topic_count(estimate, per)
            assert c >= 1 and c & (c - 1) == 0
            if estimate > per:
                ratio = estimate / per
                assert c / 2**0.5 <= ratio < c * 2**0.5 or (c == 1 and ratio < 2**0.5)
    with pytest.raises(ValueError):
        topic_count(10, 0)


def test_a_peers_topic_is_sha256_of_its_id_bytes_mod_count() -> None:
    peer = sim_peer_id(1, 7)
    raw = base58.b58decode(peer)
    for count in (1, 2, 4, 128):
        assert topic_index(peer, count) == int.from_bytes(hashlib.sha256(raw).digest(), "big") % count
    # Halving the count merges pairs of topics: a peer's index mod the smaller count is kept.
    assert topic_index(peer, 64) == topic_index(peer, 128) % 64


def test_topics_fill_evenly() -> None:
    sizes = Counter(topic_index(sim_peer_id(1, i), 32) for i in range(256))
    assert len(sizes) == 32 and sum(sizes.values()) == 256
    assert max(sizes.values()) <= 20 and min(sizes.values()) >= 2  # binomial(256, 1/32): mean 8


def test_names_round_trip_and_strange_names_are_not_load_topics() -> None:
    name = load_topic_name(FP, 4, 3)
    assert name == f"/p2pinfer/load/1/{FP}/4/3"
    assert parse_load_topic(name) == (FP, 4, 3)
    assert topic_of(sim_peer_id(1, 0), FP, 4) == load_topic_name(FP, 4, topic_index(sim_peer_id(1, 0), 4))
    for bad in (
        f"/p2pinfer/digest/1/{FP}",
        f"/p2pinfer/load/1/{FP}/3/0",  # not a power of two
        f"/p2pinfer/load/1/{FP}/4/4",  # index out of range
        f"/p2pinfer/load/1/{FP}/04/1",  # two names for one topic
        f"/p2pinfer/load/1/{FP}/4",
        "/p2pinfer/load/1//4/1",
        f"/p2pinfer/load/1/{FP}/4/-1",
        f"/p2pinfer/load/1/{FP}/{1 << 30}/0",
    ):
        assert parse_load_topic(bad) is None, bad
    with pytest.raises(ValueError):
        load_topic_name(FP, 4, 4)


def test_a_move_keeps_the_old_topic_for_the_grace_period() -> None:
    peer = sim_peer_id(1, 3)
    state = LoadTopicState(peer, FP, nodes_per_topic=8, grace_s=30.0)
    first = state.update(5, now=0.0)
    assert first.subscribe == (load_topic_name(FP, 1, 0),) and not first.unsubscribe
    assert state.moves == 0 and state.update(9, now=1.0).subscribe == ()  # same count: nothing
    grown = state.update(40, now=2.0)  # 4 topics
    assert grown.subscribe == (topic_of(peer, FP, 4),) and not grown.unsubscribe
    assert state.moves == 1 and state.subscribed() == (topic_of(peer, FP, 4), load_topic_name(FP, 1, 0))
    assert state.update(40, now=31.0).unsubscribe == ()  # still in the grace period
    assert state.update(40, now=32.0).unsubscribe == (load_topic_name(FP, 1, 0),)
    assert state.subscribed() == (topic_of(peer, FP, 4),)


def test_moving_back_within_the_grace_period_rejoins_nothing() -> None:
    state = LoadTopicState(sim_peer_id(1, 3), FP, nodes_per_topic=8, grace_s=30.0)
    state.update(5, 0.0)
    state.update(40, 1.0)
    back = state.update(5, 2.0)
    assert back.subscribe == () and back.unsubscribe == ()  # still subscribed to the old one
    assert state.current == load_topic_name(FP, 1, 0) and state.moves == 2
    assert set(state.subscribed()) == {load_topic_name(FP, 1, 0), topic_of(state.peer_id, FP, 4)}
    gone = state.reset()
    assert set(gone.unsubscribe) == {load_topic_name(FP, 1, 0), topic_of(state.peer_id, FP, 4)}
    assert state.subscribed() == () and state.count == 0
