"""The network model: per-link latency, gossipsub cost, wire sizes."""

from __future__ import annotations

import statistics

import pytest

from p2pinfer.core.peers import Load
from p2pinfer.sim.network import digest_message_bytes, gossip_copies, load_report_bytes, mesh_hops, parse_latency


def test_latency_models() -> None:
    fixed = parse_latency("2.5")
    assert fixed.link_ms(0, 1) == 2.5 and fixed.link_ms(3, 3) == 0.0
    uni = parse_latency("uniform:10:50", seed=3)
    links = [uni.link_ms(0, j) for j in range(1, 400)]
    assert all(10 <= x <= 50 for x in links) and statistics.fmean(links) == pytest.approx(30, abs=2.5)
    assert uni.link_ms(4, 9) == uni.link_ms(9, 4) == parse_latency("uniform:10:50", seed=3).link_ms(4, 9)
    assert uni.link_ms(4, 9) != parse_latency("uniform:10:50", seed=4).link_ms(4, 9)
    logn = parse_latency("lognormal:20:0.5", seed=1)
    assert statistics.median(logn.link_ms(0, j) for j in range(1, 2001)) == pytest.approx(20, rel=0.08)
    for bad in ("fast", "uniform:5", "uniform:9:3", "gamma:1:2", "-1"):
        with pytest.raises(ValueError):
            parse_latency(bad)


def test_mesh_model() -> None:
    assert [mesh_hops(n, 6) for n in (2, 7, 8, 37, 38, 1024)] == [1, 1, 2, 2, 3, 4]
    assert [gossip_copies(n, 6) for n in (2, 4, 7, 1024)] == [1, 3, 6, 6]
    # The default is the live node's gossipsub D (3).
    assert [mesh_hops(n) for n in (2, 4, 5, 10, 11, 1024)] == [1, 1, 2, 2, 3, 7]
    assert [gossip_copies(n) for n in (2, 3, 4, 1024)] == [1, 2, 3, 3]


def test_wire_sizes_match_the_generated_protobuf() -> None:
    wire = pytest.importorskip("p2pinfer.net.wire")
    node = "12D3KooW" + "x" * 44
    fp = "0123456789abcdef"
    for queued, active, busy, epoch, version in [(0, 0, False, 0, 0), (1500, 3, True, (1 << 63) - 5, 77), (5, 1, False, 300, 1 << 20)]:
        report = wire.load_to_pb(node, fp, Load(queued, 4.35, active), busy, epoch, version, ["/ip4/203.0.113.7/tcp/4001"])
        assert load_report_bytes(node, fp, queued, active, busy, epoch, version) == len(wire.encode_gossip_load(report))
    for slots, free, wait in [(8, 0, 1250.0), (4, 3, 0.0), (300, 0, 7.5)]:
        report = wire.load_to_pb(node, fp, Load(9, 4.35, 9, slots, free, wait), False, 1, 1, ["/ip4/203.0.113.7/tcp/4001"])
        size = load_report_bytes(node, fp, 9, 9, False, 1, 1, slots=slots, free_slots=free, slot_wait_ms=wait)
        assert size == len(wire.encode_gossip_load(report))
    for n in (0, 100, 5000, 300_000):
        assert digest_message_bytes(n) == len(wire.encode_gossip_digest(b"d" * n))


def test_gossip_envelope_matches_a_real_signed_pubsub_rpc() -> None:
    """What one gossip copy adds to its payload, against py-libp2p's own encoding."""
    pytest.importorskip("libp2p")
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.id import ID
    from libp2p.pubsub.pb import rpc_pb2
    from libp2p.utils import encode_varint_prefixed

    from p2pinfer.net.host import digest_topic
    from p2pinfer.sim.network import DEFAULT_ENVELOPE_BYTES, TOPIC_CHARS, gossip_envelope_bytes

    keys = create_new_key_pair()
    topic = digest_topic("ab" * 32)
    assert len(topic) == TOPIC_CHARS
    for payload_len in (60, 150, 1200):
        payload = b"x" * payload_len
        msg = rpc_pb2.Message(
            from_id=ID.from_pubkey(keys.public_key).to_bytes(), data=payload, seqno=(12345).to_bytes(8, "big"),
            topicIDs=[topic],
        )
        msg.key = keys.public_key.serialize()
        msg.signature = keys.private_key.sign(b"libp2p-pubsub:" + msg.SerializeToString())
        framed = len(encode_varint_prefixed(rpc_pb2.RPC(publish=[msg]).SerializeToString())) + 12 + 18  # yamux, Noise
        assert framed - payload_len == gossip_envelope_bytes(payload=payload_len)
    assert DEFAULT_ENVELOPE_BYTES == gossip_envelope_bytes(payload=200)


def test_find_node_sizes_are_py_libp2ps_encoding() -> None:
    """The simulator's KadDHT byte counts: a real FIND_NODE request and answer
    (py-libp2p's protobuf, signed peer records of real Ed25519 peers)."""
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.kad_dht.pb.kademlia_pb2 import Message
    from libp2p.peer.envelope import seal_record
    from libp2p.peer.id import ID
    from libp2p.peer.peer_record import PeerRecord
    import multiaddr

    from p2pinfer.core.directory import anchor_key
    from p2pinfer.sim.network import (
        KAD_MULTISTREAM_BYTES,
        STREAM_FRAME_BYTES,
        find_node_request_bytes,
        find_node_response_bytes,
        signed_peer_record_bytes,
    )

    def record() -> tuple[ID, bytes]:
        pair = create_new_key_pair()
        peer = ID.from_pubkey(pair.public_key)
        addr = multiaddr.Multiaddr("/ip4/10.1.2.3/tcp/40123")
        return peer, seal_record(PeerRecord(peer, [addr]), pair.private_key).marshal_envelope()

    me, mine = record()
    assert len(mine) == signed_peer_record_bytes()
    wire = 4 * STREAM_FRAME_BYTES + KAD_MULTISTREAM_BYTES + 2  # open + negotiate, varint frame, message frame, FIN
    request = Message(type=Message.MessageType.FIND_NODE, key=anchor_key(7), senderRecord=mine).SerializeToString()
    assert find_node_request_bytes(len(anchor_key(7))) == len(request) + wire
    for n in (1, 7, 20):
        answer = Message(type=Message.MessageType.FIND_NODE, senderRecord=mine)
        for _ in range(n):
            peer, env = record()
            p = answer.closerPeers.add()
            p.id, p.connection, p.signedRecord = peer.to_bytes(), Message.ConnectionType.CONNECTED, env
            p.addrs.append(multiaddr.Multiaddr("/ip4/10.1.2.4/tcp/40124").to_bytes())
        assert find_node_response_bytes(n) == len(answer.SerializeToString()) + wire
