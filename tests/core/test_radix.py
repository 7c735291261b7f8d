"""The radix tree against a brute-force model: a set of token sequences."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from p2pinfer.core import BlockHasher, DigestTracker, ModelFingerprint, RadixTree, TreeEvent

# Small alphabet so sequences share prefixes often.
seqs = st.lists(st.integers(0, 3), min_size=1, max_size=40)


def brute_match(cached: set[tuple[int, ...]], tokens: list[int]) -> int:
    best = 0
    for seq in cached:
        n = 0
        while n < min(len(seq), len(tokens)) and seq[n] == tokens[n]:
            n += 1
        best = max(best, n)
    return best


def prefix_closure_size(cached: set[tuple[int, ...]]) -> int:
    return len({seq[:i] for seq in cached for i in range(1, len(seq) + 1)})


@given(st.lists(seqs, max_size=30), seqs)
def test_match_equals_brute_force(inserted: list[list[int]], probe: list[int]) -> None:
    tree = RadixTree()
    for seq in inserted:
        tree.insert(seq)
    cached = {tuple(s) for s in inserted}
    assert tree.match(probe) == brute_match(cached, probe)
    assert tree.total_tokens == prefix_closure_size(cached)
    # Every stored sequence is a prefix of something inserted and vice versa.
    stored = set(tree.sequences())
    assert all(any(s[: len(x)] == x for s in cached) for x in stored)
    assert all(tree.match(list(s)) == len(s) for s in cached)


def test_insert_reports_new_tokens_and_events() -> None:
    tree = RadixTree()
    events: list[TreeEvent] = []
    tree.subscribe(events.append)
    assert tree.insert([1, 2, 3, 4]) == 4
    assert tree.insert([1, 2, 9]) == 1
    assert tree.insert([1, 2]) == 0
    assert [(e.kind, e.path, e.start) for e in events] == [("insert", (1, 2, 3, 4), 0), ("insert", (1, 2, 9), 2)]
    assert tree.total_tokens == 5


def test_lru_eviction_keeps_recent_and_pinned() -> None:
    tree = RadixTree()
    tree.insert([1, 1, 1, 1])
    tree.insert([2, 2, 2, 2])
    tree.insert([3, 3, 3, 3])
    tree.match([1, 1, 1, 1])  # 1... is now most recent; 2... is the oldest
    handle = tree.pin([2, 2])  # ...but pinned
    evicted = tree.evict(8)
    assert evicted == 4
    assert tree.match([3, 3, 3, 3], touch=False) == 0
    assert tree.match([2, 2, 2, 2], touch=False) == 4
    assert tree.match([1, 1, 1, 1], touch=False) == 4
    tree.unpin(handle)
    tree.evict(4)
    assert tree.match([2, 2, 2, 2], touch=False) == 0
    assert tree.match([1, 1, 1, 1], touch=False) == 4


def test_pin_survives_split_and_unpins_exactly() -> None:
    tree = RadixTree()
    tree.insert([5, 6, 7, 8, 9])
    handle = tree.pin([5, 6])  # pins the whole node [5..9]
    tree.insert([5, 6, 7, 0])  # splits the pinned node at 3
    assert tree.evict(0) == 1  # only the unpinned [0] leaf can go
    assert tree.match([5, 6, 7, 8, 9], touch=False) == 5
    tree.unpin(handle)
    assert tree.evict(0) == 5
    assert tree.total_tokens == 0


def test_capacity_enforced_on_insert() -> None:
    tree = RadixTree(capacity_tokens=10)
    for k in range(5):
        tree.insert([k] * 4)
    assert tree.total_tokens <= 10
    assert tree.match([4, 4, 4, 4], touch=False) == 4  # the newest stays


def test_remove_drops_unshared_suffix_only() -> None:
    tree = RadixTree()
    tree.insert([1, 2, 3, 4])
    tree.insert([1, 2, 5])
    assert tree.remove([1, 2, 3, 4]) == 2
    assert set(tree.sequences()) == {(1, 2, 5)}


def test_unpin_twice_is_an_error() -> None:
    tree = RadixTree()
    tree.insert([1, 2, 3])
    handle = tree.pin([1, 2, 3])
    tree.unpin(handle)
    try:
        tree.unpin(handle)
    except ValueError:
        pass
    else:
        raise AssertionError("a second unpin must be refused")


class TreeMachine(RuleBasedStateMachine):
    """Random inserts, matches, pins, evictions; invariants after each step."""

    def __init__(self) -> None:
        super().__init__()
        self.tree = RadixTree()
        self.fp = ModelFingerprint("m", "t", "c", block_size=2)
        self.tracker = DigestTracker(BlockHasher(self.fp), "n")
        self.tree.subscribe(self.tracker.on_event)
        self.inserted: set[tuple[int, ...]] = set()
        self.pins: list[tuple[object, tuple[int, ...]]] = []

    @rule(seq=seqs)
    def insert(self, seq: list[int]) -> None:
        self.tree.insert(seq)
        self.inserted.add(tuple(seq))

    @rule(seq=seqs)
    def pin(self, seq: list[int]) -> None:
        matched = self.tree.match(seq, touch=False)
        handle = self.tree.pin(seq)
        self.pins.append((handle, tuple(seq[:matched])))

    @precondition(lambda self: bool(self.pins))
    @rule(i=st.integers(0, 100))
    def unpin(self, i: int) -> None:
        handle, _ = self.pins.pop(i % len(self.pins))
        self.tree.unpin(handle)  # type: ignore[arg-type]

    @rule(budget=st.integers(0, 60))
    def evict(self, budget: int) -> None:
        self.tree.evict(budget)
        pinned = self.tree.pinned_tokens()
        assert self.tree.total_tokens <= max(budget, pinned)

    @invariant()
    def pinned_prefixes_stay(self) -> None:
        for _, prefix in self.pins:
            assert self.tree.match(list(prefix), touch=False) == len(prefix)

    @invariant()
    def stored_is_prefix_of_inserted(self) -> None:
        for seq in self.tree.sequences():
            assert any(s[: len(seq)] == seq for s in self.inserted)

    @invariant()
    def digest_follows_tree(self) -> None:
        hasher = self.tracker.hasher
        expected = {h for seq in self.tree.sequences() for h in hasher.hashes(seq)}
        assert self.tracker.hashes == expected

    @invariant()
    def total_matches_paths(self) -> None:
        assert self.tree.total_tokens == prefix_closure_size(set(self.tree.sequences()))


TestTreeMachine = TreeMachine.TestCase
TestTreeMachine.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)


@given(st.lists(seqs, min_size=1, max_size=20), st.data())
def test_remove_matches_brute_force(inserted: list[list[int]], data: st.DataObject) -> None:
    tree = RadixTree()
    for seq in inserted:
        tree.insert(seq)
    victim = data.draw(st.sampled_from(sorted(set(tree.sequences()))))
    others = set(tree.sequences()) - {victim}
    tree.remove(list(victim))
    # Everything another sequence needs stays; the victim's own tail goes.
    assert all(tree.match(list(s), touch=False) == len(s) for s in others)
    assert tree.match(list(victim), touch=False) == brute_match(others, list(victim))


def test_a_partial_hit_refreshes_only_the_part_it_used() -> None:
    # Issue 22: A+q1 cached, then C, then a request reuses A (with another
    # question). The unused tail q1 keeps its old place in the LRU order, so
    # the next eviction takes q1, not the whole of C.
    tree = RadixTree(capacity_tokens=100)
    a, q1, q2 = list(range(1, 31)), list(range(100, 120)), list(range(200, 220))
    c = list(range(300, 340))
    tree.insert(a + q1)
    tree.insert(c)
    assert tree.match(a + q2) == 30  # a real hit on A only
    tree.insert(list(range(400, 420)))  # 110 tokens: 10 over the budget
    assert tree.match(c, touch=False) == 40
    assert tree.match(a + q1, touch=False) == 30  # q1 went, A stayed
