"""The live directory's pieces without processes: the placement metric is
py-libp2p's own, the wire refuses what it must, and a directory node never
applies a register that names another holder."""

from __future__ import annotations

import random

import cbor2
import pytest
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.kad_dht.utils import sort_peer_ids_by_distance
from libp2p.peer.id import ID

from p2pinfer.core.blocks import ModelFingerprint
from p2pinfer.core.directory import (
    AnchorUpdate,
    DirectoryConfig,
    DirectoryError,
    KademliaPlacement,
    Refusal,
    Register,
    Resend,
    Answer,
    anchor_key,
    decode_message,
    encode_message,
    make_query,
)
from p2pinfer.core.peers import Load
from p2pinfer.core.radix import RadixTree
from p2pinfer.core.router import Router
from p2pinfer.net.directory import DirectoryService


def peer_ids(n: int) -> list[str]:
    return [ID.from_pubkey(create_new_key_pair().public_key).to_base58() for _ in range(n)]


def test_kademlia_placement_is_the_order_py_libp2p_sorts_peers_in():
    ids = peer_ids(12)
    placement = KademliaPlacement(ids, replicas=3)
    rng = random.Random(5)
    for _ in range(50):
        anchor = rng.getrandbits(64)
        libp2p_order = sort_peer_ids_by_distance(anchor_key(anchor), [ID.from_base58(p) for p in ids])
        assert placement.owners(anchor) == [p.to_base58() for p in libp2p_order[:3]]


def test_kademlia_placement_moves_only_what_a_join_or_leave_touches():
    ids = peer_ids(10)
    placement = KademliaPlacement(ids[:9], replicas=2)
    anchors = [random.Random(i).getrandbits(64) for i in range(200)]
    before = {a: placement.owners(a) for a in anchors}
    changed = set(placement.add(ids[9]))
    fresh = KademliaPlacement(ids, replicas=2)
    for a in anchors:
        assert placement.owners(a) == fresh.owners(a)
        assert (before[a] != placement.owners(a)) == (a in changed)
        if a in changed:
            assert ids[9] in placement.owners(a)
    gone = set(placement.remove(ids[0]))
    assert gone == {a for a in anchors if ids[0] in fresh.owners(a)}
    assert all(ids[0] not in placement.owners(a) for a in anchors)


def test_anchor_key_fits_find_node():
    # py-libp2p's FIND_NODE handler accepts a non-multihash key of 2..50 bytes only.
    assert 2 <= len(anchor_key(2**64 - 1)) <= 50


def test_refusal_round_trip_and_strict_decoding():
    msg = Refusal("NOT_HOLDER", "a register from X names holder Y")
    assert decode_message(encode_message(msg)) == msg
    with pytest.raises(DirectoryError, match="refusal code"):
        decode_message(cbor2.dumps({"s": 2, "t": "err", "c": "NOPE", "m": ""}))
    with pytest.raises(DirectoryError, match="at most 512"):
        decode_message(cbor2.dumps({"s": 2, "t": "err", "c": "INTERNAL", "m": "x" * 513}))
    with pytest.raises(DirectoryError, match="exactly the keys"):
        decode_message(cbor2.dumps({"s": 2, "t": "err", "c": "INTERNAL"}))


class _Placement:
    def __init__(self, self_id: str) -> None:
        self.self_id = self_id

    def owners(self, anchor: int) -> list[str]:
        return [self.self_id]


def _service() -> tuple[DirectoryService, Router]:
    me = peer_ids(1)[0]
    router = Router(me, ModelFingerprint("directory-units", "t", "c"), RadixTree(10_000))
    service = DirectoryService(host=None, router=router, placement=_Placement(me), config=DirectoryConfig(), load=Load, timeout_s=1.0)  # type: ignore[arg-type]
    return service, router


def test_a_register_must_name_the_streams_peer():
    service, router = _service()
    holder, other = peer_ids(2)
    hashes = router.hasher.hashes(list(range(1000, 1000 + 160)))
    reg = Register(holder, 1, Load(), (AnchorUpdate(hashes[3], True, frozenset(hashes[3:])),))
    reply = service.on_message(other, encode_message(reg), 0.0)
    assert isinstance(reply, Refusal) and reply.code == "NOT_HOLDER"
    assert service.store.anchors() == []  # nothing applied
    assert service.on_message(holder, encode_message(reg), 0.0) == Resend(())
    answer = service.on_message(other, encode_message(make_query(hashes, 160, DirectoryConfig())), 0.0)
    assert isinstance(answer, Answer) and [h.holder for h in answer.holders] == [holder]
    assert answer.holders[0].match_blocks == 10


def test_garbage_and_replies_are_refused_with_a_reason():
    service, _ = _service()
    peer = peer_ids(1)[0]
    reply = service.on_message(peer, b"\xff\x00garbage", 0.0)
    assert isinstance(reply, Refusal) and reply.code == "BAD_REQUEST"
    reply = service.on_message(peer, encode_message(Resend((1, 2))), 0.0)
    assert isinstance(reply, Refusal) and reply.code == "BAD_REQUEST" and "Resend" in reply.message
    assert service.refused == {"BAD_REQUEST": 2}


def test_a_holder_past_its_block_limit_is_refused_and_forgotten():
    service, router = _service()
    service.store.max_blocks_per_holder = 8
    holder = peer_ids(1)[0]
    hashes = router.hasher.hashes(list(range(1000, 1000 + 160)))  # 10 blocks
    reg = Register(holder, 1, Load(), (AnchorUpdate(hashes[3], True, frozenset(hashes)),))
    reply = service.on_message(holder, encode_message(reg), 0.0)
    assert isinstance(reply, Refusal) and reply.code == "LIMIT" and "the limit is 8" in reply.message
    assert service.store.anchors() == [] and service.refused == {"LIMIT": 1}


class _Bucket:
    def __init__(self, size: int) -> None:
        self._size, self.bucket_size = size, 20

    def size(self) -> int:
        return self._size


class _Table:
    def __init__(self, peers: list[ID], full: bool) -> None:
        self.peers = list(peers)
        self.buckets = [_Bucket(20 if full else len(peers))]

    def get_peer_ids(self) -> list[ID]:
        return list(self.peers)

    def peer_in_table(self, peer: ID) -> bool:
        return peer in self.peers

    def remove_peer(self, peer: ID) -> bool:
        if peer in self.peers:
            self.peers.remove(peer)
            return True
        return False


class _Routing:
    """A DHT whose lookups converge to the true closest of ``universe``."""

    def __init__(self, universe: list[ID]) -> None:
        self.universe = universe
        self.asked: list[bytes] = []

    async def find_closest_peers_network(self, key: bytes, count: int = 20) -> list[ID]:
        self.asked.append(key)
        return sort_peer_ids_by_distance(key, self.universe)[:count]


class _Dht:
    def __init__(self, table: _Table, routing: _Routing) -> None:
        self.routing_table, self.peer_routing = table, routing


class _Host:
    def get_connected_peers(self) -> list[ID]:
        return []

    def get_peerstore(self) -> "_Host":
        return self

    def get_protocols(self, peer: ID) -> list[str]:
        return []  # identify has not run for any of them


async def test_an_incomplete_routing_table_is_completed_by_dht_lookups_of_each_anchor():
    from p2pinfer.net.directory import DhtPlacement

    universe = [ID.from_base58(p) for p in peer_ids(60)]
    me, table_sample = universe[0], universe[1:21]  # 20 of 59 others: a full bucket, a sample
    routing = _Routing(universe)
    placement = DhtPlacement(_Host(), _Dht(_Table(table_sample, full=True), routing), me.to_base58(), replicas=2)  # type: ignore[arg-type]
    await placement.sync()
    truth = KademliaPlacement([p.to_base58() for p in universe], replicas=2)
    anchors = [random.Random(i).getrandbits(64) for i in range(30)]
    wrong_before = sum(placement.owners(a) != truth.owners(a) for a in anchors)
    assert wrong_before > 0  # a sample of the keyspace places some anchors wrongly
    moved = await placement.resolve(anchors, now=0.0)
    assert all(placement.owners(a) == truth.owners(a) for a in anchors)
    assert set(moved) >= {a for a in anchors if truth.owners(a) != KademliaPlacement([p.to_base58() for p in [me, *table_sample]], 2).owners(a)}
    assert len(routing.asked) == len(anchors)
    await placement.resolve(anchors, now=1.0)  # looked up already: no new lookups before the TTL
    assert len(routing.asked) == len(anchors)
    # A found owner that cannot be reached is forgotten: its anchors move to the next closest.
    owner = truth.owners(anchors[0])[0]
    if owner != me.to_base58():
        assert anchors[0] in placement.forget(owner)
        assert owner not in placement.owners(anchors[0])


async def test_a_complete_routing_table_needs_no_lookups():
    from p2pinfer.net.directory import DhtPlacement

    universe = [ID.from_base58(p) for p in peer_ids(10)]
    routing = _Routing(universe)
    placement = DhtPlacement(_Host(), _Dht(_Table(universe[1:], full=False), routing), universe[0].to_base58(), replicas=2)  # type: ignore[arg-type]
    await placement.sync()
    assert await placement.resolve([1, 2, 3], now=0.0) == []
    assert routing.asked == []
    truth = KademliaPlacement([p.to_base58() for p in universe], replicas=2)
    assert all(placement.owners(a) == truth.owners(a) for a in (1, 2, 3))


# -- the KadDHT rules the simulator shares (p2pinfer/core/dht.py) ---------------------------
def test_the_dht_constants_are_py_libp2ps():
    from libp2p.kad_dht import common, kad_dht

    from p2pinfer.core import dht

    assert (dht.BUCKET_SIZE, dht.ALPHA, dht.MAX_BUCKETS) == (common.BUCKET_SIZE, common.ALPHA, common.MAXIMUM_BUCKETS)
    assert dht.ROUTING_TABLE_REFRESH_S == kad_dht.ROUTING_TABLE_REFRESH_INTERVAL


class _NoHost:
    def get_id(self) -> None:
        return None


async def test_kbucket_sizes_are_what_py_libp2ps_routing_table_ends_with():
    """The simulator's nodes use kbucket_sizes for their tables: it must equal
    py-libp2p's RoutingTable fed the same peers, in any order."""
    from libp2p.kad_dht.routing_table import RoutingTable, peer_id_to_key
    from libp2p.peer.peerinfo import PeerInfo
    import multiaddr

    from p2pinfer.core.dht import kbucket_sizes, routing_table_complete

    me = ID.from_base58(peer_ids(1)[0])
    addr = multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/4001")
    for n, seed in ((15, 1), (70, 2), (130, 3)):
        others = [ID.from_base58(p) for p in peer_ids(n)]
        random.Random(seed).shuffle(others)
        table = RoutingTable(me, _NoHost())  # type: ignore[arg-type]
        for peer in others:
            assert await table.add_peer(PeerInfo(peer, [addr]), skip_server_mode_check=True)
        real = [b.size() for b in table.buckets]
        keys = sorted(int.from_bytes(peer_id_to_key(p), "big") for p in [me, *others])
        assert kbucket_sizes(keys, exclude=int.from_bytes(peer_id_to_key(me), "big")) == real
        assert routing_table_complete(real) == all(s < 20 for s in real)
        assert sum(real) == n  # py-libp2p's table keeps every peer it hears of


def test_a_resolve_is_due_at_first_use_then_after_the_ttl_and_never_while_complete():
    from p2pinfer.core.dht import ResolveSchedule

    s = ResolveSchedule(300.0)
    assert s.due([1, 2, 2], 10.0, complete=True) == []
    assert s.due([1, 2, 2], 10.0, complete=False) == [1, 2]
    assert s.due([1, 2, 3], 309.0, complete=False) == [3]
    assert s.due([1, 2, 3], 310.0, complete=False) == [1, 2]
