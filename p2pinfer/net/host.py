"""Builds and runs the libp2p side of a node: host, pubsub, gossipsub.

Choices made here, once: TCP transport, Noise as the *only* security
protocol (py-libp2p also offers plaintext and secio by default, which a
peer could otherwise negotiate), Yamux as the muxer, messages signed and
checked (strict signing: a digest or load report always comes from the
peer it names), gossipsub peer scoring driven by our own verdicts
(:mod:`.sanctions`), and an optional pre-shared key (libp2p pnet) derived
from the swarm secret so that outsiders cannot even complete a handshake.

What an idle node pays per peer and per second is kept low here (issue 14,
docs/results.md "Idle cost of a node"):

* gossipsub v1.1, not v1.2: v1.2's IDONTWANT is one control RPC to every
  mesh peer for every message received, worth it for large messages, and
  ours are a few hundred bytes (py-libp2p 0.8.1 sends it for any size);
* a fixed heartbeat of :data:`HEARTBEAT_S` (2 s), with py-libp2p's "adaptive
  gossip" off: it rescales the heartbeat to 30-60 s whenever its health
  score dips (a small or young mesh is enough), which made the heartbeat,
  and with it the score decay that sanctions rely on, unpredictable;
* no signed peer record in every RPC (:class:`CountingPubsub`): py-libp2p
  attaches the sender's record to each RPC and the receiver decodes it and
  checks its Ed25519 signature every time; the record still goes once per
  pubsub stream, in the hello RPC;
* yamux window updates once per half window rather than per read
  (:mod:`.libp2p_patches`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import logging

import blake3
from google.protobuf.message import DecodeError
import multiaddr
import trio

from libp2p import create_yamux_muxer_option, new_host
from libp2p.abc import IHost
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.x25519 import create_new_key_pair as create_x25519_key_pair
from libp2p.pubsub.gossipsub import PROTOCOL_ID, PROTOCOL_ID_V11, GossipSub
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub
from libp2p.pubsub.rpc_queue import DefaultMaxMessageSize
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.tools.anyio_service import background_trio_service

from ..core.load_topics import digest_topic, parse_load_topic
from ..core.router import MESH_DEGREE
from .config import ConfigError, NodeConfig
from . import libp2p_patches
from .counters import NodeCounters
from .sanctions import gossip_score_params

HEARTBEAT_S = 2
"""gossipsub heartbeat (mesh upkeep, IHAVE gossip, score decay), seconds.

2 s, not libp2p's 1 s (issue 14): each heartbeat sends IHAVE gossip to the
non-mesh peers of every topic whose message cache holds anything (in one
idle swarm of 16, 1.9 of a node's 6.4 pubsub RPCs a second), and the
heartbeat itself (mesh upkeep, score decay over every peer) another
4 % of its busy time. What depends on it is rescaled or bounded elsewhere:
penalties decay per second whatever the heartbeat
(``gossip_score_params(HEARTBEAT_S)``, :data:`.sanctions.DECAY_PER_S`) and a
sanction is lifted on our own clock (``PeerSanctions._lift``); a mesh that
lost a peer is repaired at the next heartbeat (2 s) while the remaining
mesh peers keep delivering (D_low = D - 1); IHAVE advertises the last 3
heartbeats (6 s) and IWANT serves the last 5 (10 s); lost digests are pulled
on a version gap (:mod:`.pull`), which no heartbeat drives."""

__all__ = ["AllowedTopics", "Libp2pStack", "allowed_topics", "derive_psk", "dialable_addrs", "digest_topic", "run_stack"]

log = logging.getLogger(__name__)

_PSK_CONTEXT = "p2pinfer 2026 libp2p pnet pre-shared key v1"


def derive_psk(secret: bytes) -> str:
    """The 32-byte libp2p pnet key (hex) for a swarm secret.

    A different derivation context than the block-hash key, so neither key
    reveals the other.
    """
    return blake3.blake3(secret, derive_key_context=_PSK_CONTEXT).hexdigest()


class AllowedTopics(frozenset[str]):
    """The topics a remote peer may subscribe to with us: the given ones and
    every load topic of our model (their names depend on the swarm's size)."""

    fingerprint_hex: str = ""

    def __contains__(self, topic: object) -> bool:
        if frozenset.__contains__(self, topic):
            return True
        parsed = parse_load_topic(topic) if isinstance(topic, str) else None
        return parsed is not None and parsed[0] == self.fingerprint_hex


def allowed_topics(topics: set[str], fingerprint_hex: str) -> AllowedTopics:
    allowed = AllowedTopics(topics)
    allowed.fingerprint_hex = fingerprint_hex
    return allowed


def _multiaddrs(values: tuple[str, ...], what: str) -> list[multiaddr.Multiaddr]:
    out = []
    for value in values:
        try:
            out.append(multiaddr.Multiaddr(value))
        except Exception as exc:
            raise ConfigError(f"{what} address {value!r} is not a multiaddr: {exc}") from None
    return out


def dialable_addrs(addrs: list[multiaddr.Multiaddr]) -> list[str]:
    """Listen addresses as peers can dial them: wildcards become interface addresses.

    ``/ip4/0.0.0.0`` is expanded to every IPv4 interface, loopback last
    (useful on one machine, and harmless elsewhere: the Noise handshake
    checks the peer id, so a dial that reaches another process fails).
    """
    from libp2p.utils.address_validation import expand_wildcard_address

    out: list[str] = []
    for addr in addrs:
        text = str(addr)
        if text.startswith("/ip4/0.0.0.0/") or text.startswith("/ip6/::/"):
            suffix = text.split("/p2p/", 1)[1] if "/p2p/" in text else ""
            base = multiaddr.Multiaddr(text.split("/p2p/", 1)[0])
            expanded = [str(a) for a in expand_wildcard_address(base) if str(a) != str(base)]
            loop = text.split("/p2p/", 1)[0].replace("/ip4/0.0.0.0/", "/ip4/127.0.0.1/").replace("/ip6/::/", "/ip6/::1/")
            for item in [*expanded, loop]:
                out.append(f"{item}/p2p/{suffix}" if suffix else item)
        else:
            out.append(text)
    return list(dict.fromkeys(out))


_CONTROL_KINDS = ("ihave", "iwant", "graft", "prune", "idontwant")


def _publish_kind(data: bytes) -> str:
    """``publish load`` or ``publish digest`` from a GossipMessage's first bytes
    (``version = 1``, then field 2 or 3), without decoding it."""
    if data[:2] == b"\x08\x01" and len(data) > 2:
        if data[2] == 0x12:
            return "publish digest"
        if data[2] == 0x1A:
            return "publish load"
    return "publish other"


def rpc_kinds(rpc: rpc_pb2.RPC) -> list[str]:
    """What one pubsub RPC carries: a kind per published message, per control part."""
    kinds = ["publish model" if "/p2pinfer/models/1" in msg.topicIDs else _publish_kind(msg.data) for msg in rpc.publish]
    if rpc.subscriptions:
        kinds.append("subscriptions")
    if rpc.HasField("control"):
        control = rpc.control
        kinds.extend(name for name in _CONTROL_KINDS if len(getattr(control, name)))
    return kinds or ["empty"]


class CountingPubsub(Pubsub):
    """py-libp2p's Pubsub, counting every RPC it writes (:attr:`NodeCounters.pubsub_rpcs_sent`),
    without the signed peer record in each.

    Every outbound RPC (our messages, relayed copies, gossipsub control,
    subscriptions) goes through :meth:`write_msg`, so this sees the whole
    pubsub traffic of a node, which our own gossip counters (one count per
    message we publish or receive) do not.

    py-libp2p 0.8.1 puts its signed peer record (about 210 bytes) in every
    RPC, and the receiver decodes it and verifies its signature each time
    (``libp2p.pubsub.utils.maybe_consume_signed_record``, called twice for an
    RPC with control messages): in an idle swarm of 8 that was 17 % of a
    node's CPU and half its pubsub bytes. The record only feeds the
    peerstore's certified addresses (gossipsub peer exchange, which we do
    not use); the hello RPC that opens each pubsub stream still carries it,
    so a peer verifies it once per stream. Message authenticity does not
    depend on it: every message is signed by its origin (strict signing),
    and the stream itself is authenticated by Noise. A receiver that finds
    no record accepts the RPC (older p2pinfer nodes included).

    Also: an RPC that does not parse is the sender's fault, not ours.
    py-libp2p 0.8.1 lets the ``DecodeError`` out of its read loop, which
    takes the whole host down (one garbage frame from any peer stopped a
    node); here it resets that stream, drops the peer from pubsub and
    counts ``gossip_rejected["malformed rpc"]``.
    """

    counters: NodeCounters | None = None

    async def _handle_new_peer(self, peer_id: Any) -> None:
        """No pubsub stream to a peer reached only through a relay (gossip never needs one:
        :meth:`p2pinfer.node.nat.NodeNat._pubsub_watch`).

        py-libp2p 0.8.1 opens a pubsub stream on every new connection, and when one
        ends while the peer is still connected (``_handle_dead_peer``) it opens a new
        one at once. The watch closed each stream over a relayed connection every
        0.5 s and py-libp2p reopened it: two new streams a second each way, each with
        its hello (subscriptions, signed peer record), a model announcement replayed
        from the message cache and a GRAFT, about 3.9 KB/s through the relay for
        every relayed pair of an idle swarm (issue 17, docs/results/issue17-relay-idle).
        Refused here, the retry loop ends; a direct connection (a hole punch) opens
        the stream as before (pubsub asks again on each new connection)."""
        from .connections import connections_of, is_relayed

        conns = connections_of(self.host, peer_id)
        if conns and all(is_relayed(c) for c in conns):
            if self.counters is not None:
                self.counters.pubsub_relayed_refused += 1
            return
        await super()._handle_new_peer(peer_id)

    async def continuously_read_stream(self, stream: Any) -> None:
        try:
            await super().continuously_read_stream(stream)
        except DecodeError as exc:
            peer_id = stream.muxed_conn.peer_id
            log.warning("malformed pubsub RPC from %s (%s): stream reset", peer_id, exc)
            if self.counters is not None:
                self.counters.gossip_rejected["malformed rpc"] += 1
            try:
                await stream.reset()
            except Exception:  # already gone
                pass
            self._handle_dead_peer(peer_id)

    async def write_msg(self, stream: Any, rpc_msg: rpc_pb2.RPC) -> bool:
        if rpc_msg.HasField("senderRecord"):
            rpc_msg.ClearField("senderRecord")
        counters = self.counters
        if counters is not None:
            kinds = rpc_kinds(rpc_msg)
            for kind in kinds:
                counters.pubsub_rpcs_sent[kind] += 1
            counters.pubsub_bytes_sent[kinds[0]] += rpc_msg.ByteSize()
        return await super().write_msg(stream, rpc_msg)


@dataclass
class Libp2pStack:
    host: IHost
    pubsub: Pubsub
    gossipsub: GossipSub
    listen: list[multiaddr.Multiaddr]


def build_stack(config: NodeConfig, key_pair: KeyPair, topic: str, counters: NodeCounters | None = None) -> Libp2pStack:
    libp2p_patches.apply()
    from .model_gossip import MODELS_TOPIC
    listen = _multiaddrs(config.listen, "listen")
    announce = _multiaddrs(config.announce, "announce") or None
    noise = NoiseTransport(key_pair, noise_privkey=create_x25519_key_pair().private_key)
    host = new_host(
        key_pair=key_pair,
        sec_opt={NOISE_PROTOCOL_ID: noise},
        muxer_opt=create_yamux_muxer_option(),
        listen_addrs=listen,
        announce_addrs=announce,
        enable_mDNS=config.mdns,
        psk=derive_psk(config.swarm_secret) if config.private_network and config.swarm_secret else None,
    )
    gossipsub = GossipSub(
        protocols=[PROTOCOL_ID_V11, PROTOCOL_ID],  # no v1.2: see the module docstring
        degree=MESH_DEGREE,
        degree_low=MESH_DEGREE - 1,
        degree_high=MESH_DEGREE + 1,
        time_to_live=30,
        heartbeat_initial_delay=0.1,
        heartbeat_interval=HEARTBEAT_S,
        adaptive_gossip_enabled=False,
        # Our own validator limits each origin's rate; gossipsub's limit is
        # per *forwarder* and would drop a relay's traffic in a busy swarm.
        max_messages_per_topic_per_second=1000.0,
        # Every peer of a loopback or single-NAT swarm shares one IP.
        eclipse_protection_enabled=False,
        # Peer scoring: only penalties we impose (sanctions.py) lower a score.
        score_params=gossip_score_params(HEARTBEAT_S),
    )
    # py-libp2p 0.8's "GRAFT flood" check (gossipsub v1.4) records when a peer
    # PRUNEd *us* and penalises that peer's GRAFT within 10 s of it: the
    # opposite of the spec's rule (a GRAFT inside the backoff *we* gave with
    # our PRUNE, which ``_check_back_off`` already enforces). In a small mesh
    # (D = 3) two honest peers that prune and re-graft each other kept
    # penalising each other: hundreds of "GRAFT flood detected" warnings per
    # 16-node idle run, behaviour penalties on honest peers and mesh churn
    # (issue 14). A threshold of 0 turns that check off; the backoff rule stays.
    gossipsub.graft_flood_threshold = 0.0
    pubsub = CountingPubsub(
        host,
        gossipsub,
        strict_signing=True,
        max_inbound_rpc_size=DefaultMaxMessageSize,
        allowed_topics={topic, MODELS_TOPIC},
    )
    # Load topics come and go with the swarm's size: allowed by their name's shape.
    pubsub.allowed_topics = allowed_topics({topic, MODELS_TOPIC}, topic.rsplit("/", 1)[-1])
    pubsub.counters = counters
    return Libp2pStack(host, pubsub, gossipsub, listen)


@asynccontextmanager
async def run_stack(stack: Libp2pStack) -> AsyncIterator[None]:
    """Listen, start pubsub and gossipsub; stops all of them on exit."""
    async with stack.host.run(listen_addrs=stack.listen):
        async with background_trio_service(stack.pubsub), background_trio_service(stack.gossipsub):
            await stack.pubsub.wait_until_ready()
            try:
                yield
            finally:
                with trio.CancelScope(shield=True):
                    with trio.move_on_after(5):
                        await stack.host.close()
