"""The prefix directory: anchors, placement, holder tracking, the store, the wire."""

from __future__ import annotations

import random

import cbor2
from hypothesis import given, settings, strategies as st
import pytest

from p2pinfer.core import LOCAL, BlockHasher, Load, LocalState, ModelFingerprint, PeerView, RadixTree, RouteRequest
from p2pinfer.core.directory import (
    MAX_ANSWER_HOLDERS,
    MAX_DIRECTORY_BYTES,
    MAX_QUERY_BLOCKS,
    AnchorCheck,
    AnchorTracker,
    AnchorUpdate,
    Answer,
    AnswerHolder,
    DirectoryConfig,
    DirectoryError,
    DirectoryStore,
    DirectoryView,
    Query,
    Register,
    Rendezvous,
    Resend,
    anchor_of,
    apply_answer,
    decode_message,
    encode_message,
    make_query,
    xor_of,
)
from p2pinfer.core.digest import Digest
from p2pinfer.core.peers import MAX_REPORTED_SLOT_WAIT_MS, MAX_REPORTED_SLOTS
from p2pinfer.core.policies import CostPolicy

FP = ModelFingerprint("m", "t", "c")
H = BlockHasher(FP)
K = 4  # anchor depth in blocks


def seq(header: int, tail: int, n_tail_blocks: int, header_blocks: int = 6) -> list[int]:
    """A shared header (header_blocks blocks) then a distinct tail."""
    return [1000 * header + i for i in range(16 * header_blocks)] + [10**6 + 1000 * tail + i for i in range(16 * n_tail_blocks)]


# -- anchors -------------------------------------------------------------------


def test_anchor_is_the_hash_at_depth_and_shared_by_common_prefixes() -> None:
    a, b, c = H.hashes(seq(1, 1, 3)), H.hashes(seq(1, 2, 5)), H.hashes(seq(2, 1, 3))
    assert anchor_of(a, K) == a[K - 1] == anchor_of(b, K)
    assert anchor_of(c, K) != anchor_of(a, K)
    assert anchor_of(a[: K - 1], K) is None  # shorter than the anchor: not in the directory
    # Two prompts that differ only after the anchor depth share it; one that
    # differs before it (token 20) does not.
    d = seq(1, 1, 3)
    d[20] += 1
    assert anchor_of(H.hashes(d), K) != anchor_of(a, K)


def test_config_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        DirectoryConfig(anchor_blocks=0)
    with pytest.raises(ValueError):
        DirectoryConfig(answer_holders=MAX_ANSWER_HOLDERS + 1)
    with pytest.raises(ValueError):
        DirectoryConfig(refresh_s=0)
    with pytest.raises(ValueError, match="expire before their refresh"):
        DirectoryConfig(refresh_s=100.0, entry_ttl_s=75.0)


# -- rendezvous placement -----------------------------------------------------------

members = st.lists(st.text("abcdefgh12345", min_size=1, max_size=6), min_size=1, max_size=12, unique=True)
keys = st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=30, unique=True)


@given(members, keys, st.integers(1, 3), st.randoms(use_true_random=False))
def test_owners_do_not_depend_on_join_order(ms: list[str], ks: list[int], r: int, rnd: random.Random) -> None:
    shuffled = list(ms)
    rnd.shuffle(shuffled)
    a, b = Rendezvous(ms, r), Rendezvous([], r)
    for m in shuffled:
        b.add(m)
    assert all(a.owners(k) == b.owners(k) for k in ks)
    assert all(len(a.owners(k)) == min(r, len(ms)) for k in ks)


@given(members, keys, st.text("xyz", min_size=1, max_size=4), st.integers(1, 2))
def test_a_join_moves_only_the_keys_the_newcomer_wins(ms: list[str], ks: list[int], new: str, r: int) -> None:
    rv = Rendezvous(ms, r)
    before = {k: rv.owners(k) for k in ks}
    changed = set(rv.add(new))
    for k in ks:
        after = rv.owners(k)
        if k in changed:
            assert new in after and [m for m in after if m != new] == before[k][: len(after) - 1]
        else:
            assert after == before[k]  # an unrelated join moves nothing
        assert after == Rendezvous([*ms, new], r).owners(k)  # the cache agrees with a fresh computation


@given(members, keys, st.integers(1, 2), st.data())
def test_a_leave_moves_only_the_keys_the_leaver_owned(ms: list[str], ks: list[int], r: int, data: st.DataObject) -> None:
    rv = Rendezvous(ms, r)
    before = {k: rv.owners(k) for k in ks}
    gone = data.draw(st.sampled_from(ms))
    changed = set(rv.remove(gone))
    fresh = Rendezvous([m for m in ms if m != gone], r)
    for k in ks:
        assert (k in changed) == (gone in before[k])
        if k not in changed:
            assert rv.owners(k) == before[k]
        assert rv.owners(k) == fresh.owners(k) and gone not in rv.owners(k)


def test_placement_spreads_keys_over_members() -> None:
    rv = Rendezvous([f"node-{i}" for i in range(10)])
    counts: dict[str, int] = {}
    rng = random.Random(5)
    for _ in range(5000):
        owner = rv.owner(rng.getrandbits(64))
        assert owner is not None
        counts[owner] = counts.get(owner, 0) + 1
    assert len(counts) == 10 and max(counts.values()) < 1.25 * 500 and min(counts.values()) > 0.75 * 500
    assert Rendezvous().owner(1) is None


# -- the holder's tracker --------------------------------------------------------------


def tracked(capacity: int | None = None) -> tuple[RadixTree, AnchorTracker]:
    tree = RadixTree(capacity)
    tracker = AnchorTracker(H, K)
    tree.subscribe(tracker.on_event)
    return tree, tracker


def test_tracker_reports_blocks_at_and_below_the_anchor() -> None:
    tree, tracker = tracked()
    s1, s2 = seq(1, 1, 3), seq(1, 2, 2)
    h1, h2 = H.hashes(s1), H.hashes(s2)
    tree.insert(s1)
    tree.insert(s2)
    tree.insert(list(range(16 * (K - 1))))  # shorter than the anchor: untracked
    (u,) = tracker.take_updates()
    assert u.anchor == h1[K - 1] and not u.full and not u.removed
    assert u.added == frozenset(h1[K - 1 :]) | frozenset(h2[K - 1 :])
    assert tracker.take_updates() == []
    tree.remove(s2)
    (u,) = tracker.take_updates()
    assert u.removed == frozenset(h2[6:]) and not u.added  # only s2's own tail went
    (full,) = tracker.full()
    assert full.full and full.added == frozenset(h1[K - 1 :]) == tracker.held(u.anchor)


def test_tracker_cancels_changes_that_undo_each_other_and_unregisters_empty_anchors() -> None:
    tree, tracker = tracked()
    s = seq(3, 1, 2)
    anchor = H.hashes(s)[K - 1]
    tree.insert(s)
    tree.remove(s)
    assert tracker.take_updates() == [] and tracker.pending == 0
    tree.insert(s)
    tracker.take_updates()
    tree.clear()
    (u,) = tracker.take_updates()
    assert u.removed == frozenset(H.hashes(s)[K - 1 :]) and tracker.anchors() == []
    assert tracker.full([anchor]) == [AnchorUpdate(anchor, True, frozenset())]  # an explicit unregister


def test_tracker_follows_lru_eviction() -> None:
    tree, tracker = tracked(capacity=16 * 10)
    a, b = seq(1, 1, 2, header_blocks=5), seq(2, 1, 2, header_blocks=5)  # 7 blocks each
    tree.insert(a)
    tree.insert(b)  # evicts a
    ups = {u.anchor: u for u in tracker.take_updates()}
    assert set(ups) == {H.hashes(b)[K - 1]} and ups[H.hashes(b)[K - 1]].added == frozenset(H.hashes(b)[K - 1 :])
    assert tracker.anchors() == [H.hashes(b)[K - 1]]


# -- the directory store -----------------------------------------------------------------

S1, S2 = seq(1, 1, 4), seq(1, 2, 4)
H1, H2 = H.hashes(S1), H.hashes(S2)
ANCHOR = H1[K - 1]


def reg(holder: str, hashes: list[int], queued: int = 0, *, full: bool = False, removed: list[int] = (), epoch: int = 1) -> Register:  # type: ignore[assignment]
    return Register(holder, epoch, Load(queued, 4.0, 0), (AnchorUpdate(ANCHOR, full, frozenset(hashes), frozenset(removed)),))


def query(hashes: list[int], limit: int = 8, stride: int = 1, tail: int = 1) -> Query:
    config = DirectoryConfig(anchor_blocks=K, answer_holders=limit, query_stride=stride, query_tail=tail)
    q = make_query(hashes, len(hashes) * 16, config)
    assert q is not None
    return q


def test_store_answers_with_the_deepest_match_per_holder() -> None:
    store = DirectoryStore()
    store.apply(reg("a", H1[K - 1 :]), 0.0)  # all of S1
    store.apply(reg("b", H2[K - 1 :]), 0.0)  # S2: shares 6 blocks with S1
    store.apply(reg("c", H1[K - 1 : 7]), 0.0)  # S1's first 7 blocks
    got = {h.holder: h.match_blocks for h in store.answer(query(H1), 0.0).holders}
    assert got == {"a": 10, "b": 6, "c": 7}
    assert [h.holder for h in store.answer(query(H1), 0.0).holders] == ["a", "c", "b"]  # idle: cheapest prefill first
    assert {h.holder for h in store.answer(query(H1), 0.0, exclude="a").holders} == {"b", "c"}
    assert len(store.answer(query(H1, limit=2), 0.0).holders) == 2
    assert store.answer(Query(12345, K, 1, 1, K, (12345,), 64, 8), 0.0).holders == ()


def test_a_strided_query_understates_a_match_by_less_than_the_stride() -> None:
    store = DirectoryStore()
    store.apply(reg("a", H1[K - 1 :]), 0.0)  # all 10 blocks of S1
    store.apply(reg("b", H2[K - 1 :]), 0.0)  # shares 6 blocks with S1
    store.apply(reg("c", H1[K - 1 : 9]), 0.0)  # 9 blocks
    q = query(H1, stride=3)
    assert q.depths() == [4, 7, 10] and q.hashes == (H1[3], H1[6], H1[9])
    got = {h.holder: h.match_blocks for h in store.answer(q, 0.0).holders}
    assert got == {"a": 10, "b": 4, "c": 7}  # the last block is always asked: a full match is exact
    exact = {h.holder: h.match_blocks for h in store.answer(query(H1), 0.0).holders}
    assert all(exact[h] - 3 < got[h] <= exact[h] for h in got)
    # A dense tail of 4 blocks asks depths 4, then 7..10: exact for prompts that part there.
    q = query(H1, stride=3, tail=4)
    assert q.depths() == [4, 7, 8, 9, 10]
    assert {h.holder: h.match_blocks for h in store.answer(q, 0.0).holders} == {"a": 10, "b": 4, "c": 9}
    assert make_query(H1[: K - 1], 48, DirectoryConfig(anchor_blocks=K)) is None


def test_store_ranks_by_queue_and_drains_old_reports() -> None:
    store = DirectoryStore()
    store.apply(reg("busy", H1[K - 1 :], queued=2000), 0.0)  # 8 s of queue at 4 ms per token
    store.apply(reg("cold", H1[K - 1 : 6]), 0.0)  # idle, holds 6 blocks: 4 blocks = 256 ms of prefill
    assert [h.holder for h in store.answer(query(H1), 0.0).holders] == ["cold", "busy"]
    late = store.answer(query(H1), 20.0).holders  # 20 s later the queue has drained
    assert [h.holder for h in late] == ["busy", "cold"] and late[0].age_s == 20.0
    assert late[0].load.queued_prefill_tokens == 2000  # the answer carries the report as it was


def test_the_slot_fields_travel_and_rank_a_holder_without_a_free_slot_last() -> None:
    # "full" holds the whole prompt but its 2 slots decode long answers for 6 s more; "free" holds
    # 6 of 10 blocks (64 tokens to prefill: 256 ms) with a slot free. Only the slot fields tell them apart.
    full = Load(0, 4.0, 2, slots=2, free_slots=0, slot_wait_ms=6000.0, speed_measured=False)
    free = Load(0, 4.0, 1, slots=2, free_slots=1, slot_wait_ms=0.0)
    store = DirectoryStore()
    for holder, load, hashes in (("full", full, H1[K - 1 :]), ("free", free, H1[K - 1 : 6])):
        msg = decode_message(encode_message(Register(holder, 1, load, (AnchorUpdate(ANCHOR, False, frozenset(hashes)),))))
        assert isinstance(msg, Register) and msg.load == load
        store.apply(msg, 0.0)
    answer = decode_message(encode_message(store.answer(query(H1), 0.0)))
    assert isinstance(answer, Answer)
    assert [(h.holder, h.load) for h in answer.holders] == [("free", free), ("full", full)]
    # 10 s later its answers have ended (the wait drains as the queue does): the full match wins.
    assert [h.holder for h in store.answer(query(H1), 10.0).holders] == ["full", "free"]


def test_store_unregister_full_update_epoch_and_expiry() -> None:
    store = DirectoryStore()
    store.apply(reg("a", H1[K - 1 :]), 0.0)
    store.apply(reg("a", [], removed=H1[7:]), 1.0)
    assert store.holders(ANCHOR) == {"a": frozenset(H1[K - 1 : 7])}
    store.apply(reg("a", H2[K - 1 :], full=True), 2.0)  # a full update replaces
    assert store.holders(ANCHOR) == {"a": frozenset(H2[K - 1 :])}
    store.apply(reg("a", [], removed=H2[K - 1 :]), 3.0)  # everything removed: unregistered
    assert store.holders(ANCHOR) == {} and store.anchors() == [] and len(store) == 0
    store.apply(reg("a", H1[K - 1 :]), 4.0)
    store.apply(reg("a", H2[K - 1 : 5], epoch=2), 5.0)  # restarted: the old records are void
    assert store.holders(ANCHOR) == {"a": frozenset(H2[K - 1 : 5])}
    store.apply(reg("b", H1[K - 1 :]), 50.0)
    assert store.expire(60.0, ttl=30.0) == 1 and set(store.holders(ANCHOR)) == {"b"}
    store.drop_holder("b")
    assert store.anchors() == []


def test_checks_confirm_matching_records_and_ask_for_the_rest() -> None:
    tree, tracker = tracked()
    tree.insert(S1)
    tracker.take_updates()
    (check,) = tracker.checks()
    assert check == AnchorCheck(ANCHOR, len(H1) - K + 1, xor_of(H1[K - 1 :]))
    store = DirectoryStore()
    store.apply(reg("a", H1[K - 1 :]), 0.0)
    store.apply(reg("b", H1[K - 1 : 7]), 0.0)
    ok = Register("a", 1, Load(), (), (check,))
    assert store.apply(ok, 50.0) == []  # matches: refreshed without resending a block
    assert store.apply(Register("b", 1, Load(), (), (check,)), 50.0) == [ANCHOR]  # b's record differs
    assert store.apply(Register("c", 1, Load(), (), (check,)), 50.0) == [ANCHOR]  # nothing known of c
    assert store.expire(60.0, ttl=30.0) == 1 and set(store.holders(ANCHOR)) == {"a"}  # b was not refreshed
    # A check applies after the updates of the same message.
    assert store.apply(Register("b", 1, Load(), (AnchorUpdate(ANCHOR, True, frozenset(H1[K - 1 :])),), (check,)), 61.0) == []


def test_a_resync_full_set_keeps_pending_changes_for_the_other_owners() -> None:
    tree, tracker = tracked()
    tree.insert(S1)
    (full,) = tracker.full([ANCHOR], clear_pending=False)
    assert full.added == frozenset(H1[K - 1 :]) and tracker.pending == len(full.added)
    tracker.full([ANCHOR])
    assert tracker.pending == 0


# -- the entry: the same CostPolicy over view + answer ------------------------------------


def test_entry_forwards_to_an_answered_holder_with_the_same_cost_policy() -> None:
    view = PeerView(FP.hex(), "me")
    answer = Answer(ANCHOR, (AnswerHolder("far", 10, Load(0, 4.0, 0), 0.5), AnswerHolder("me", 10, Load(), 0.0)))
    apply_answer(view, answer, 10.0, FP.hex())
    assert "me" not in view and view.get("far").load_at == 9.5  # type: ignore[union-attr]
    request = RouteRequest(len(S1), H1, 16)
    local = LocalState("me", 0, Load(0, 4.0))
    decision = CostPolicy().decide(request, local, DirectoryView(view, answer, 16), 10.0, random.Random(1))  # type: ignore[arg-type]
    assert decision.target == "far" and decision.predicted_match_tokens == 160
    # Without the answer the same view knows no match: it recomputes locally.
    decision = CostPolicy().decide(request, local, DirectoryView(view, None, 16), 10.0, random.Random(1))  # type: ignore[arg-type]
    assert decision.target == LOCAL


def test_apply_answer_never_overwrites_a_fresher_load_report() -> None:
    view = PeerView(FP.hex(), "me")
    view.update_load("p", Load(7, 4.0), 10.0)
    apply_answer(view, Answer(ANCHOR, (AnswerHolder("p", 5, Load(999, 4.0), 3.0),)), 11.0, FP.hex())
    state = view.get("p")
    assert state is not None and state.load.queued_prefill_tokens == 7 and state.fingerprint == FP.hex()


# -- the wire -----------------------------------------------------------------------------

u64 = st.integers(0, 2**64 - 1)
hash_sets = st.frozensets(u64, max_size=50)
ids = st.text(min_size=1, max_size=60)
@st.composite
def loads(draw: st.DrawFn) -> Load:
    slots = draw(st.integers(1, MAX_REPORTED_SLOTS))
    return Load(draw(st.integers(0, 2**40)), draw(st.floats(0, 1e6, allow_nan=False)), draw(st.integers(0, 2**20)),
                slots, draw(st.integers(0, slots)), draw(st.floats(0, MAX_REPORTED_SLOT_WAIT_MS, allow_nan=False)),
                draw(st.booleans()))


@st.composite
def updates(draw: st.DrawFn) -> AnchorUpdate:
    full = draw(st.booleans())
    added = draw(hash_sets)
    removed = frozenset() if full else draw(hash_sets) - added
    return AnchorUpdate(draw(u64), full, added, removed)


checks = st.lists(st.builds(AnchorCheck, u64, st.integers(0, 2**40), u64), max_size=5, unique_by=lambda c: c.anchor)


@given(ids, st.integers(0, 2**62), loads(), st.lists(updates(), max_size=5, unique_by=lambda u: u.anchor), checks)
def test_register_round_trip(holder: str, epoch: int, load: Load, ups: list[AnchorUpdate], cks: list[AnchorCheck]) -> None:
    msg = Register(holder, epoch, load, tuple(ups), tuple(cks))
    assert decode_message(encode_message(msg)) == msg


@given(st.frozensets(u64, max_size=20))
def test_resend_round_trip(anchors: frozenset[int]) -> None:
    msg = Resend(tuple(sorted(anchors)))
    assert decode_message(encode_message(msg)) == msg


@given(st.lists(u64, min_size=1, max_size=80), st.integers(1, 10), st.integers(1, 6), st.integers(1, 20), st.integers(0, 10**6), st.integers(1, MAX_ANSWER_HOLDERS))
def test_query_round_trip(hashes: list[int], depth: int, stride: int, tail: int, prompt: int, limit: int) -> None:
    config = DirectoryConfig(anchor_blocks=depth, query_stride=stride, query_tail=tail, answer_holders=limit)
    msg = make_query(hashes, prompt, config)
    if len(hashes) < depth:
        assert msg is None
        return
    assert msg is not None and len(msg.hashes) == len(msg.depths()) and msg.depths()[-1] == len(hashes)
    assert msg.depths()[-tail:] == list(range(max(depth, len(hashes) - tail + 1), len(hashes) + 1))
    assert msg.hashes == tuple(hashes[d - 1] for d in msg.depths())
    assert decode_message(encode_message(msg)) == msg


@given(u64, st.lists(st.builds(AnswerHolder, ids, st.integers(0, 10**6), loads(), st.integers(0, 10**7).map(lambda ms: ms / 1000)), max_size=8))
def test_answer_round_trip(anchor: int, holders: list[AnswerHolder]) -> None:
    msg = Answer(anchor, tuple(holders))
    assert decode_message(encode_message(msg)) == msg


@settings(max_examples=1500)
@given(st.binary(max_size=400))
def test_garbage_raises_only_directory_error(data: bytes) -> None:
    try:
        decode_message(data)
    except DirectoryError:
        pass


REG = {"s": 2, "t": "reg", "n": "h", "e": 0, "l": [0, 4.0, 0, 2, 1, 0.0, True], "u": [[5, False, b"", b""]], "c": [[5, 1, 7]]}
QRY = {"s": 2, "t": "q", "a": 5, "d": 4, "i": 2, "w": 1, "b": 6, "h": (5).to_bytes(8, "little") + (6).to_bytes(8, "little"), "p": 96, "k": 8}
ANS = {"s": 2, "t": "ans", "a": 5, "r": [["h", 4, 0, 4.0, 0, 2, 1, 0.0, True, 10]]}


@pytest.mark.parametrize(
    "doc",
    [
        [1, 2],
        {**REG, "s": 1},  # another schema (1: loads without the slot fields)
        {**REG, "t": "other"},
        {**REG, "extra": 1},
        {k: v for k, v in REG.items() if k != "e"},
        {**REG, "n": ""},
        {**REG, "n": "x" * 500},
        {**REG, "e": -1},
        {**REG, "l": [0, float("nan"), 0, 2, 1, 0.0, True]},
        {**REG, "l": [0, 4, 0, 2, 1, 0.0, True]},  # ms per token must be a float
        {**REG, "l": [-1, 4.0, 0, 2, 1, 0.0, True]},
        {**REG, "l": [0, 4.0, 0]},  # schema 1's load, without the slot fields
        {**REG, "l": [0, 4.0, 0, 0, 0, 0.0, True]},  # no slots
        {**REG, "l": [0, 4.0, 0, MAX_REPORTED_SLOTS + 1, 0, 0.0, True]},
        {**REG, "l": [0, 4.0, 0, 2, 3, 0.0, True]},  # more free slots than slots
        {**REG, "l": [0, 4.0, 0, 2, True, 0.0, True]},
        {**REG, "l": [0, 4.0, 0, 2, 0, -1.0, True]},
        {**REG, "l": [0, 4.0, 0, 2, 0, float("inf"), True]},
        {**REG, "l": [0, 4.0, 0, 2, 0, MAX_REPORTED_SLOT_WAIT_MS * 2, True]},
        {**REG, "l": [0, 4.0, 0, 2, 0, 5, True]},  # the wait must be a float
        {**REG, "l": [0, 4.0, 0, 2, 0, 0.0, 1]},  # speed_measured must be a boolean
        {**REG, "l": [0, 4.0, 0, 2, 0, 0.0]},  # without speed_measured
        {**REG, "u": [[5, True, b"", b"\1" * 8]]},  # a full update removes nothing
        {**REG, "u": [[5, False, b"\1" * 8, b"\1" * 8]]},  # added and removed
        {**REG, "u": [[5, False, b"\0" * 16, b""]]},  # repeated hash
        {**REG, "u": [[5, False, b"", b""], [5, False, b"", b""]]},  # repeated anchor
        {**REG, "u": [[2**64, False, b"", b""]]},
        {**REG, "u": [[5, 1, b"", b""]]},
        {**REG, "u": [[5, False, b"1234567", b""]]},
        {**REG, "c": [[5, 1, 7], [5, 2, 7]]},  # repeated anchor
        {**REG, "c": [[5, 1]]},
        {**REG, "c": [[5, 1, 2**64]]},
        {"s": 2, "t": "resend", "a": b"\0" * 16},  # repeated anchor
        {"s": 2, "t": "resend", "a": b"", "x": 1},
        {**QRY, "h": (6).to_bytes(8, "little") * 2},  # must start with the anchor
        {**QRY, "b": 7},  # depths 4, 6, 7: three hashes, not two
        {**QRY, "b": 2**62},
        {**QRY, "d": 7},  # past the last block
        {**QRY, "i": 0},
        {**QRY, "w": 0},
        {**QRY, "w": 2},  # depths 4, 5, 6: three hashes
        {**QRY, "h": b""},
        {**QRY, "k": 0},
        {**QRY, "k": MAX_ANSWER_HOLDERS + 1},
        {**QRY, "d": 0},
        {**QRY, "i": 1, "b": 3 + MAX_QUERY_BLOCKS + 1, "h": (5).to_bytes(8, "little") * (MAX_QUERY_BLOCKS + 1)},
        {**ANS, "r": [["h", 4, 0, 4.0, 0, 2, 1, 0.0, True]]},
        {**ANS, "r": [["h", 4, 0, 4.0, 0, 10]]},  # schema 1's holder, without the slot fields
        {**ANS, "r": [["h", 4, 0, 4.0, 0, 2, 3, 0.0, True, 10]]},
        {**ANS, "r": [["h", 4, 0, 4.0, 0, 2, 1, 0.0, True, 10]] * (MAX_ANSWER_HOLDERS + 1)},
        {**ANS, "a": cbor2.CBORTag(2, b"\1")},  # tags (bignums!) are refused
    ],
)
def test_schema_violations_are_rejected(doc: object) -> None:
    with pytest.raises(DirectoryError):
        decode_message(cbor2.dumps(doc))


def test_valid_documents_decode() -> None:
    assert isinstance(decode_message(cbor2.dumps(REG)), Register)
    assert isinstance(decode_message(cbor2.dumps(QRY)), Query)
    assert isinstance(decode_message(cbor2.dumps(ANS)), Answer)
    assert decode_message(cbor2.dumps({"s": 2, "t": "resend", "a": b""})) == Resend(())


def test_oversized_messages_are_refused_before_decoding() -> None:
    with pytest.raises(DirectoryError, match="exceeds"):
        decode_message(b"\0" * (MAX_DIRECTORY_BYTES + 1))
    with pytest.raises(DirectoryError):
        decode_message("not bytes")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        encode_message(object())  # type: ignore[arg-type]


def test_an_owner_vouches_for_the_holders_its_answer_gives_more_than_the_entrys_digests() -> None:
    from p2pinfer.core.directory import askable_owners, vouched_by

    hashes = H.hashes(list(range(1, 16 * 8 + 1)))
    view = PeerView(FP.hex(), "me")
    view.apply_digest(Digest("full", "gossiper", FP.hex(), 1, added=frozenset(hashes[:6])), 0.0)
    assert view.longest_matches(hashes) == {"gossiper": 6}
    answer = Answer(hashes[3], (
        AnswerHolder("gossiper", 6, Load(), 0.0),   # no more than its own digest says: nothing vouched
        AnswerHolder("quiet", 8, Load(), 0.0),      # known only from the answer
        AnswerHolder("owner", 8, Load(), 0.0),      # the owner naming itself is judged as the holder
        AnswerHolder("me", 8, Load(), 0.0),
    ))
    assert vouched_by(view, answer, hashes, "owner") == (("quiet", "owner"),)
    assert vouched_by(view, answer, hashes, "me") == ()  # this node's own store: the holders' registrations
    assert askable_owners(["a", "me", "b"], "me", lambda o: o in ("a", "me")) == ["me", "b"]


def test_a_holder_over_its_block_limit_is_refused_and_dropped_and_the_oldest_holder_makes_room() -> None:
    from p2pinfer.core.directory import DirectoryLimit, Refusal

    store = DirectoryStore(max_blocks_per_holder=5, max_holders=2)
    store.apply(reg("a", H1[K - 1 : K + 2]), 0.0)  # 3 blocks
    store.apply(reg("a", H1[K + 2 : K + 4]), 1.0)  # 5 in all: at the limit, kept
    assert len(store.holders(ANCHOR)["a"]) == 5
    with pytest.raises(DirectoryLimit, match="6 blocks here, the limit is 5"):
        store.apply(reg("a", H1[K + 4 : K + 5]), 2.0)
    assert "a" not in store.holders(ANCHOR) and store.holder_info("a") is None and store.refused_over_limit == 1
    # A full re-registration of what it holds replaces, not adds: 4 blocks, kept.
    store.apply(reg("a", H1[K - 1 : K + 3], full=True), 3.0)
    store.apply(reg("a", H1[K - 1 : K + 3], full=True), 4.0)
    assert len(store.holders(ANCHOR)["a"]) == 4
    store.apply(reg("b", H2[K - 1 : K]), 5.0)
    store.apply(reg("c", H2[K - 1 : K]), 6.0)  # a third holder: "a" was heard from least recently
    assert set(store.holders(ANCHOR)) == {"b", "c"} and store.holders_evicted == 1
    assert decode_message(encode_message(Refusal("LIMIT", "over"))) == Refusal("LIMIT", "over")
    with pytest.raises(ValueError, match="max_holders"):
        DirectoryConfig(max_holders=0)
