from __future__ import annotations

from collections.abc import Iterator, Mapping, Set as AbstractSet
from typing import Any

from p2pinfer.core import BlockHasher, Digest, Load, ModelFingerprint, PeerView

FP = ModelFingerprint("m", "t", "c")
H = BlockHasher(FP)


def full(node: str, hashes: list[int], version: int, epoch: int = 7) -> Digest:
    return Digest("full", node, FP.hex(), version, 0, frozenset(hashes), epoch=epoch)


def test_longest_match_per_peer() -> None:
    view = PeerView(FP.hex(), "me")
    prompt = H.hashes(list(range(16 * 6)))
    view.apply_digest(full("a", prompt[:2], 1), 0.0)
    view.apply_digest(full("b", prompt[:5], 1), 0.0)
    view.apply_digest(full("c", [123, 456], 1), 0.0)
    assert view.longest_matches(prompt) == {"a": 2, "b": 5}


def test_match_stops_at_a_gap() -> None:
    view = PeerView(FP.hex(), "me")
    prompt = H.hashes(list(range(16 * 4)))
    view.apply_digest(full("a", [prompt[0], prompt[2], prompt[3]], 1), 0.0)
    assert view.longest_matches(prompt) == {"a": 1}


def test_versions_never_go_back_and_gaps_are_refused() -> None:
    view = PeerView(FP.hex(), "me")
    assert view.apply_digest(full("a", [1, 2], 5), 0.0) == "applied"
    assert view.apply_digest(full("a", [9], 4), 1.0) == "stale"
    assert view.longest_matches([1, 2]) == {"a": 2}
    gap = Digest("delta", "a", FP.hex(), 8, 7, frozenset({3}), epoch=7)
    assert view.apply_digest(gap, 1.0) == "gap"
    ok = Digest("delta", "a", FP.hex(), 6, 5, frozenset({3}), frozenset({2}), epoch=7)
    assert view.apply_digest(ok, 1.0) == "applied"
    assert view.longest_matches([1, 2]) == {"a": 1}
    assert view.longest_matches([1, 3]) == {"a": 2}


def test_restarted_peer_starts_over() -> None:
    view = PeerView(FP.hex(), "me")
    view.apply_digest(full("a", [1, 2], 50, epoch=1), 0.0)
    # New incarnation: version 1 of epoch 2 replaces version 50 of epoch 1.
    assert view.apply_digest(Digest("delta", "a", FP.hex(), 1, 0, frozenset({9}), epoch=2), 1.0) == "applied"
    assert view.longest_matches([1]) == {}
    assert view.longest_matches([9]) == {"a": 1}


def test_other_model_is_refused() -> None:
    view = PeerView(FP.hex(), "me")
    other = Digest("full", "x", "ffff", 1, 0, frozenset({1}))
    assert view.apply_digest(other, 0.0) == "fingerprint"
    assert "x" not in view


def test_expire_and_readmit() -> None:
    view = PeerView(FP.hex(), "me")
    view.apply_digest(full("a", [1], 1), 0.0)
    view.add("b", 5.0)
    assert view.expire(now=7.0, ttl=6.0) == ["a"]
    assert view.longest_matches([1]) == {}
    view.apply_digest(full("a", [1], 2), 8.0)
    assert view.longest_matches([1]) == {"a": 1}


def test_cheapest_peers_skip_busy_and_other_models() -> None:
    view = PeerView(FP.hex(), "me")
    for i, queued in enumerate([500, 0, 100, 50]):
        peer = f"p{i}"
        view.apply_digest(full(peer, [], 1), 0.0)
        view.update_load(peer, Load(queued, 1.0), 0.0)
        view.set_rtt(peer, 1.0, 0.0)
    view.mark_busy("p1", 0.0, 10.0)
    assert [p.peer_id for p in view.cheapest_peers(2, now=1.0)] == ["p3", "p2"]
    assert [p.peer_id for p in view.cheapest_peers(2, now=11.0)] == ["p1", "p3"]
    view.remove("p3")
    assert [p.peer_id for p in view.cheapest_peers(1, now=11.0)] == ["p1"]


class _CountingIndex(Mapping[int, AbstractSet[str]]):
    """A view's hash -> holders index that counts the work a query does on it."""

    def __init__(self, inner: Mapping[int, AbstractSet[str]]) -> None:
        self.inner = inner
        self.lookups = 0
        self.holders_seen = 0

    def __getitem__(self, key: int) -> AbstractSet[str]:
        return self.inner[key]

    def __iter__(self) -> Iterator[int]:
        return iter(self.inner)

    def __len__(self) -> int:
        return len(self.inner)

    def get(self, key: int, default: Any = None) -> Any:
        self.lookups += 1
        holders = self.inner.get(key, default)
        self.holders_seen += len(holders or ())
        return holders


def test_index_cost_does_not_depend_on_view_size() -> None:
    # Counting, not timing: the index lookups a query makes and the holders it
    # touches are the same with 4 bystanders in the view as with 2,000.
    small, large = PeerView(FP.hex(), "me"), PeerView(FP.hex(), "me")
    prompt = H.hashes(list(range(16 * 8)))
    for view, n in ((small, 4), (large, 2000)):
        for i in range(n):
            view.apply_digest(full(f"p{i}", [i + 10_000_000], 1), 0.0)
        view.apply_digest(full("holder", prompt, 1), 0.0)
    assert small.longest_matches(prompt) == large.longest_matches(prompt) == {"holder": 8}
    work = []
    for view in (small, large):
        index = view._index = _CountingIndex(view._index)  # what longest_matches queries
        assert view.longest_matches(prompt) == {"holder": 8}
        work.append((index.lookups, index.holders_seen))
    assert work[0] == work[1] == (8, 8)  # one lookup per block, one holder each
