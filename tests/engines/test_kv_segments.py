"""The span store stays equal to the radix tree through inserts, evictions and removals.

Payloads here are fake: the tokens a span would hold, so that the test can
check that restoring the planned spans in order rebuilds exactly the prefix.
"""

from __future__ import annotations

import random

from hypothesis import given, settings, strategies as st

from p2pinfer.core.radix import RadixTree
from p2pinfer.engines.kv_segments import SegmentStore

Payload = tuple[int, tuple[int, ...]]  # (first position, tokens from there)


def _payload(tokens: list[int], start: int) -> Payload:
    return (start, tuple(tokens[start:]))


def _restore(store: SegmentStore[Payload], tokens: list[int], limit: int) -> list[int]:
    """What the engine would put back: each planned span cut to its use."""
    out: list[int] = []
    for seg, upto in store.plan(tokens, limit):
        assert seg.blob is not None
        first, held = seg.blob
        assert seg.start == len(out), "spans must continue each other"
        out.extend(held[seg.start - first : upto - first])
    return out


def _reslice(store: SegmentStore[Payload]) -> None:
    """Do what the engine does for stale spans: cut the payload to the span."""
    for seg in store.stale():
        assert seg.blob is not None
        first, held = seg.blob
        cut = (seg.start, held[seg.start - first : seg.end - first])
        assert store.replace_blob(seg, cut, seg.start, seg.end)


def _check(tree: RadixTree, store: SegmentStore[Payload], queries: list[list[int]]) -> None:
    assert store.tokens_held() == tree.total_tokens
    assert not store.phantoms()
    for path in tree.sequences():
        assert _restore(store, list(path), len(path)) == list(path)
    for q in queries:
        m = tree.match(q, touch=False)
        assert _restore(store, q, len(q)) == q[:m]


def _prompts(rng: random.Random, n: int) -> list[list[int]]:
    """Prompts that share prefixes at random depths, like few-shot headers."""
    headers = [[rng.randrange(6) for _ in range(rng.randrange(1, 12))] for _ in range(3)]
    out = []
    for _ in range(n):
        base = list(rng.choice(headers))
        if out and rng.random() < 0.5:
            other = rng.choice(out)
            base = other[: rng.randrange(0, len(other) + 1)]
        out.append(base + [rng.randrange(6) for _ in range(rng.randrange(1, 10))])
    return out


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), capacity=st.sampled_from([None, 8, 20, 40]))
def test_store_tiles_the_tree(seed: int, capacity: int | None) -> None:
    rng = random.Random(seed)
    tree = RadixTree(capacity_tokens=capacity)
    store: SegmentStore[Payload] = SegmentStore(tree)
    prompts = _prompts(rng, 14)
    for p in prompts:
        action = rng.random()
        if action < 0.7:
            matched = tree.match(p)
            start = min(matched, len(p) - 1) if rng.random() < 0.2 else matched
            # a payload that starts earlier than needed is also allowed
            store.insert(p, start, _payload(p, start))
        elif action < 0.85:
            victim = rng.choice(list(tree.sequences()) or [tuple(p)])
            tree.remove(victim)
        else:
            tree.evict(rng.randrange(0, tree.total_tokens + 1))
        if rng.random() < 0.5:
            _reslice(store)
        _check(tree, store, prompts)
    tree.clear()
    assert len(store) == 0 and tree.total_tokens == 0


def test_shared_prefix_is_stored_once() -> None:
    tree = RadixTree()
    store: SegmentStore[Payload] = SegmentStore(tree)
    a = [1, 2, 3, 4, 5, 6]
    b = [1, 2, 3, 4, 9, 9, 9]
    store.insert(a, 0, _payload(a, 0))
    store.insert(b, tree.match(b), _payload(b, 4))
    assert [(s.start, s.end) for s in store.segments()] == [(0, 6), (4, 7)]
    assert store.tokens_held() == tree.total_tokens == 9
    assert [(seg.start, upto) for seg, upto in store.plan(b, 7)] == [(0, 4), (4, 7)]


def test_evicting_a_branch_cuts_the_span_it_grew_from() -> None:
    tree = RadixTree()
    store: SegmentStore[Payload] = SegmentStore(tree)
    a = [1, 2, 3, 4, 5, 6]
    b = [1, 2, 3, 4, 9, 9, 9]
    store.insert(a, 0, _payload(a, 0))
    store.insert(b, 4, _payload(b, 4))
    tree.match(b)  # b is now the most recently used: a's tail goes first
    tree.evict(tree.total_tokens - 1)
    spans = {(s.start, s.end): s for s in store.segments()}
    assert set(spans) == {(0, 4), (4, 7)}
    first = spans[(0, 4)]
    assert first.stale and (first.blob_start, first.blob_end) == (0, 6)
    assert _restore(store, b, 7) == b


def test_insert_by_someone_else_is_a_phantom() -> None:
    tree = RadixTree()
    store: SegmentStore[Payload] = SegmentStore(tree)
    tree.insert([7, 7, 7])
    assert [s.blob for s in store.phantoms()] == [None]
    assert store.plan([7, 7, 7], 3) == []
