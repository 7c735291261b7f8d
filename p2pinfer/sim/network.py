"""The network as the simulator sees it: link latency, loss, gossipsub cost.

Latency is one-way, per link, in milliseconds: ``fixed`` (every link the
same), or drawn once per link from ``uniform:LO:HI`` or
``lognormal:MEDIAN:SIGMA`` (geography: a link keeps its delay), reproducibly
from the seed. A forwarded request pays two one-way hops before its first
token reaches the client: the request going out, the first token coming
back.

Gossip is modelled on gossipsub with mesh degree ``D`` (6 by default):

* every message published in a topic reaches every subscriber;
* it arrives after ``mesh_hops(n)`` link delays (1 when the mesh is the full
  graph, else ``ceil(log_D(n - 1))``), at the typical link delay (the fixed
  value, or the distribution's median);
* each subscriber's *inbound* bandwidth is counted as ``min(D, n - 1)``
  copies of (payload + gossipsub envelope): every mesh neighbour forwards
  the message once (gossipsub v1.1, which the live node speaks: no
  IDONTWANT, an upper bound);
* the envelope is :func:`gossip_envelope_bytes` for the node's topic (277
  bytes): the signed gossipsub Message around the payload (38-byte peer id,
  8-byte seqno, the 83-character topic, 36-byte public key, 64-byte Ed25519
  signature), the RPC around it, its length prefix, one yamux frame header
  and one Noise frame. No signed peer record (the live node sends it once
  per pubsub stream, not in every RPC) and no yamux window updates (one per
  half window). IHAVE/IWANT control traffic is *not* counted;
* loss drops a message independently for each receiver (no IWANT
  recovery): full digests heal the lost deltas, as in the live node.

Direct messages (the prefix directory, :mod:`p2pinfer.core.directory`) go
over a libp2p stream opened for the exchange, with no fan-out. Each
direction is counted as it crosses the wire above TCP: every frame is a
yamux header (12 bytes) inside a noise transport message (2-byte length +
16-byte tag), 30 bytes; the initiator's first frame opens the stream and
carries multistream-select (``/multistream/1.0.0`` and the protocol id,
41 bytes), the responder echoes them, and each side closes with a FIN
frame; a message is a varint length plus its CBOR bytes. TCP/IP headers
are not counted (nor are they for gossip).
"""

from __future__ import annotations

from dataclasses import dataclass
import math
import statistics

import xxhash

from ..core.router import MESH_DEGREE

__all__ = [
    "DEFAULT_ENVELOPE_BYTES",
    "gossip_envelope_bytes",
    "DEFAULT_MESH_DEGREE",
    "LatencyModel",
    "digest_message_bytes",
    "find_node_request_bytes",
    "find_node_response_bytes",
    "signed_peer_record_bytes",
    "stream_request_bytes",
    "stream_response_bytes",
    "gossip_copies",
    "load_report_bytes",
    "mesh_hops",
    "parse_latency",
]

DEFAULT_MESH_DEGREE = MESH_DEGREE
"""The live node's gossipsub D (:data:`p2pinfer.core.router.MESH_DEGREE`)."""
TOPIC_CHARS = len("/p2pinfer/digest/1/") + 64
"""``p2pinfer.net.host.digest_topic``: a prefix and the model fingerprint in hex."""


@dataclass(frozen=True)
class LatencyModel:
    kind: str = "fixed"
    a: float = 1.0
    """fixed: the delay; uniform: low; lognormal: median (ms)."""
    b: float = 0.0
    """uniform: high; lognormal: sigma."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("fixed", "uniform", "lognormal"):
            raise ValueError(f"unknown latency kind {self.kind!r}")
        if self.a < 0 or self.b < 0 or (self.kind == "uniform" and self.b < self.a):
            raise ValueError("latency parameters must be >= 0 (and low <= high)")

    @property
    def typical_ms(self) -> float:
        if self.kind == "uniform":
            return (self.a + self.b) / 2
        return self.a

    def link_ms(self, i: int, j: int) -> float:
        """One-way delay between nodes ``i`` and ``j`` (symmetric, fixed per link)."""
        if self.kind == "fixed" or i == j:
            return 0.0 if i == j else self.a
        lo, hi = (i, j) if i < j else (j, i)
        u = (xxhash.xxh3_64_intdigest(f"{self.seed}:{lo}:{hi}".encode()) + 0.5) / 2.0**64
        if self.kind == "uniform":
            return self.a + (self.b - self.a) * u
        return self.a * math.exp(self.b * statistics.NormalDist().inv_cdf(u))

    def describe(self) -> str:
        if self.kind == "fixed":
            return f"{self.a:g} ms per hop"
        if self.kind == "uniform":
            return f"uniform {self.a:g}..{self.b:g} ms per hop (per link)"
        return f"lognormal median {self.a:g} ms, sigma {self.b:g} (per link)"


def parse_latency(text: str, seed: int = 0) -> LatencyModel:
    """``MS``, ``uniform:LO:HI`` or ``lognormal:MEDIAN:SIGMA`` (milliseconds)."""
    parts = text.strip().split(":")
    try:
        if len(parts) == 1:
            return LatencyModel("fixed", float(parts[0]), 0.0, seed)
        if len(parts) == 3 and parts[0] in ("uniform", "lognormal"):
            return LatencyModel(parts[0], float(parts[1]), float(parts[2]), seed)
    except ValueError as exc:
        raise ValueError(f"bad latency {text!r}: {exc}") from None
    raise ValueError(f"latency must be MS, uniform:LO:HI or lognormal:MEDIAN:SIGMA, not {text!r}")


def mesh_hops(n: int, degree: int = DEFAULT_MESH_DEGREE) -> int:
    """Link delays before a message published in a topic of ``n`` reaches everyone."""
    if n - 1 <= degree:
        return 1
    return max(1, math.ceil(math.log(n - 1) / math.log(degree)))


def gossip_copies(n: int, degree: int = DEFAULT_MESH_DEGREE) -> int:
    """Copies of each message a subscriber receives (one per mesh neighbour)."""
    return max(1, min(degree, n - 1))


def _varint_len(v: int) -> int:
    n = 1
    while v >= 0x80:
        v >>= 7
        n += 1
    return n


def _field_len(payload: int) -> int:
    """Tag (1 byte for field numbers < 16) + length varint + bytes."""
    return 1 + _varint_len(payload) + payload


def gossip_envelope_bytes(topic_chars: int = TOPIC_CHARS, payload: int = 200) -> int:
    """Bytes one gossip copy adds to its ``payload`` on the wire above TCP.

    py-libp2p's strictly signed ``pubsub.pb.Message`` (from: a 38-byte
    Ed25519 peer id, the data, an 8-byte seqno, one topic, the 64-byte
    signature and the 36-byte protobuf public key), inside an ``RPC.publish``
    field, with its varint length prefix, in one yamux data frame (12-byte
    header) sealed as one Noise transport message (2-byte length, 16-byte
    tag). ``payload`` only sets the width of two length varints.
    """
    message = _field_len(38) + _field_len(payload) + _field_len(8) + _field_len(topic_chars) + _field_len(64) + _field_len(36)
    rpc = _field_len(message)
    return rpc + _varint_len(rpc) + 12 + 18 - payload


DEFAULT_ENVELOPE_BYTES = gossip_envelope_bytes()


def load_report_bytes(
    node_id: str, fingerprint: str, queued: int, active: int, busy: bool, epoch: int, version: int, addr_len: int = 25,
    slots: int = 1, free_slots: int = 1, slot_wait_ms: float = 0.0,
) -> int:
    """Size of ``GossipMessage{load: LoadReport}`` (protos/p2pinfer.proto) on the wire.

    Computed from the protobuf encoding rules rather than by encoding it
    (tests/sim checks it against the generated code); one multiaddr of
    ``addr_len`` characters (``/ip4/203.0.113.7/tcp/4001``) is assumed.
    """
    body = (
        _field_len(len(node_id.encode()))
        + _field_len(len(fingerprint.encode()))
        + (1 + _varint_len(queued) if queued else 0)
        + 5  # float prefill_ms_per_token (non-zero)
        + (1 + _varint_len(active) if active else 0)
        + (2 if busy else 0)
        + (1 + _varint_len(epoch) if epoch else 0)
        + (1 + _varint_len(version) if version else 0)
        + (_field_len(addr_len) if addr_len else 0)
        + (1 + _varint_len(slots) if slots else 0)
        + (1 + _varint_len(free_slots) if free_slots else 0)
        + (5 if slot_wait_ms else 0)  # float slot_wait_ms
    )
    return 2 + _field_len(body)  # GossipMessage: version=1, then the load field


def digest_message_bytes(digest_len: int) -> int:
    """Size of ``GossipMessage{digest: bytes}`` around an encoded digest."""
    return 2 + _field_len(digest_len)


STREAM_FRAME_BYTES = 30
"""yamux header (12) + noise length (2) + noise tag (16), per frame."""
MULTISTREAM_BYTES = 41
"""varint + ``/multistream/1.0.0\\n`` (20) and varint + ``/p2pinfer/dir/1.0.0\\n`` (21)."""


def stream_request_bytes(payload: int) -> int:
    """Initiator -> responder on a fresh stream: open + negotiate, one message, FIN."""
    return (STREAM_FRAME_BYTES + MULTISTREAM_BYTES) + (STREAM_FRAME_BYTES + _varint_len(payload) + payload) + STREAM_FRAME_BYTES


def stream_response_bytes(payload: int | None) -> int:
    """Responder -> initiator: negotiation echo, the reply (if any), FIN."""
    body = 0 if payload is None else STREAM_FRAME_BYTES + _varint_len(payload) + payload
    return (STREAM_FRAME_BYTES + MULTISTREAM_BYTES) + body + STREAM_FRAME_BYTES


# -- KadDHT (py-libp2p's, which the live directory's placement runs) --------------------------
KAD_MULTISTREAM_BYTES = 37
"""varint + ``/multistream/1.0.0\\n`` (20) and varint + ``/ipfs/kad/1.0.0\\n`` (17)."""
PEER_ID_BYTES = 38
"""An Ed25519 peer id: identity multihash of the 36-byte protobuf public key."""
MULTIADDR_BYTES = 8
"""``/ip4/A.B.C.D/tcp/PORT`` in binary: the one listen address a peer record carries."""


def signed_peer_record_bytes(addrs: int = 1) -> int:
    """py-libp2p's signed peer record (``libp2p.peer.envelope.Envelope`` around a
    ``PeerRecord``), Ed25519 key: public key, payload type, payload (peer id, a
    nanosecond sequence number, ``addrs`` addresses), 64-byte signature."""
    record = _field_len(PEER_ID_BYTES) + 1 + 9 + addrs * _field_len(_field_len(MULTIADDR_BYTES))
    return _field_len(36) + _field_len(2) + _field_len(record) + _field_len(64)


def find_node_request_bytes(key_len: int) -> int:
    """A KadDHT FIND_NODE request (``kad_dht.pb.Message``: type, key, the sender's
    signed peer record) on the wire: a fresh stream (open + multistream-select
    of ``/ipfs/kad/1.0.0``), the varint and the message as two frames, a FIN."""
    msg = 2 + _field_len(key_len) + _field_len(signed_peer_record_bytes())
    return (STREAM_FRAME_BYTES + KAD_MULTISTREAM_BYTES) + (STREAM_FRAME_BYTES + _varint_len(msg)) + (STREAM_FRAME_BYTES + msg) + STREAM_FRAME_BYTES


def find_node_response_bytes(peers: int) -> int:
    """A FIND_NODE answer naming ``peers`` closer peers (each: id, one address,
    connection type, its signed peer record) plus the sender's record, on the
    wire: multistream echo, varint and message frames, FIN."""
    peer = _field_len(PEER_ID_BYTES) + _field_len(MULTIADDR_BYTES) + 2 + _field_len(signed_peer_record_bytes())
    msg = 2 + peers * _field_len(peer) + _field_len(signed_peer_record_bytes())
    return (STREAM_FRAME_BYTES + KAD_MULTISTREAM_BYTES) + (STREAM_FRAME_BYTES + _varint_len(msg)) + (STREAM_FRAME_BYTES + msg) + STREAM_FRAME_BYTES
