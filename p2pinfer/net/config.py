"""Configuration of a live node.

One frozen dataclass so that a node's behaviour is fully described by a
value that can be printed, compared and passed to a subprocess as JSON.
The routing and gossip schedule live in the core's
:class:`~p2pinfer.core.router.RouterConfig` so that the simulator and the
live node share them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ..core.directory import DirectoryConfig
from ..core.router import GossipConfig, RouterConfig, TrustConfig
from ..core.verify import VerifyConfig

__all__ = ["ConfigError", "NatConfig", "NodeConfig"]

DISCOVERY_MODES = ("gossip", "directory", "auto")
"""How a node learns who caches what (``NodeConfig.discovery``)."""
LIVE_DIRECTORY = DirectoryConfig(placement="kademlia", replicas=2, query_timeout_s=1.0)
"""The live node's directory: KadDHT placement (the only one it runs), two
owners per anchor (one may die), and a lookup timeout for a loaded machine
(an answer on loopback takes a few ms; the timeout only bounds a dead owner)."""
AUTO_DIRECTORY_NODES = 16
"""``discovery = "auto"``: the swarm size from which a node queries the
directory and stops gossiping digests (docs/configuration.md says why)."""

MAX_FRAME_BYTES = 1 << 20
"""Default largest forwarding frame: 8,192 token ids take about 40 KB."""


class ConfigError(ValueError):
    """A node configuration that cannot work (says which field and why)."""


@dataclass(frozen=True)
class NatConfig:
    """Reachability, circuit relay and hole punching (docs/configuration.md, "NAT traversal").

    The relay limits are per *circuit*, and a circuit carries a whole libp2p
    connection between two peers (forwards, gossip, pings), not one request:
    a forward of an 8,192-token prompt takes about 40 KB each way, so the
    256 MiB default lets a circuit carry thousands of requests before the
    relay resets it (the origin then opens a new one at its next forward).
    py-libp2p's own defaults (4 reservations, 8 circuits) would refuse the
    fifth volunteer behind NAT.
    """

    reachability: str = "auto"
    """``auto``: ask peers to dial us back over a fresh connection; ``public`` or
    ``private``: trust the operator and skip the checks."""
    reachability_interval_s: float = 300.0
    """Time between checks once a verdict is known (5 s until then)."""
    reachability_servers: int = 3
    """Peers asked per check."""
    relay_service: str = "auto"
    """Offer circuit relay v2 (hop) to others: ``auto`` = while reachability is
    public, ``on`` = always, ``off`` = never."""
    relay_max_reservations: int = 128
    """NATed peers that may hold a reservation on this relay at once."""
    relay_max_circuits: int = 256
    """Circuits this relay carries at once, all peers together."""
    relay_max_circuits_per_peer: int = 16
    """Circuits at once to one reserved peer (connections other peers hold to it)."""
    relay_circuit_max_bytes: int = 256 << 20
    """Bytes one circuit may carry (both directions) before the relay resets it."""
    relay_circuit_max_duration_s: float = 3600.0
    """Lifetime of one circuit before the relay resets it."""
    relay_reservation_ttl_s: float = 900.0
    """Validity of a reservation; holders renew at half of it."""
    relay_reservations: int = 2
    """Relays a node that is not publicly reachable keeps a reservation on (0: none)."""
    relays: tuple[str, ...] = ()
    """Relays to reserve on first (multiaddrs with /p2p/<id>); others are found by gossip."""
    hole_punching: bool = True
    """Try DCUtR to turn a relayed connection into a direct one."""
    max_relayed_peers: int = 8
    """Peers the dial loop connects to through a relay (forwards may open more)."""

    def __post_init__(self) -> None:
        if self.reachability not in ("auto", "public", "private"):
            raise ConfigError("nat.reachability must be auto, public or private")
        if self.relay_service not in ("auto", "on", "off"):
            raise ConfigError("nat.relay_service must be auto, on or off")
        for name in ("reachability_interval_s", "relay_circuit_max_duration_s", "relay_reservation_ttl_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"nat.{name} must be positive")
        if self.relay_reservation_ttl_s < 10:
            raise ConfigError("nat.relay_reservation_ttl_s must be at least 10 s")
        for name in ("reachability_servers", "relay_max_reservations", "relay_max_circuits", "relay_max_circuits_per_peer"):
            if getattr(self, name) < 1:
                raise ConfigError(f"nat.{name} must be at least 1")
        if self.relay_circuit_max_bytes < 64 << 10:
            raise ConfigError("nat.relay_circuit_max_bytes must be at least 64 KiB")
        if not 0 <= self.relay_reservations <= 4:
            raise ConfigError("nat.relay_reservations must be in 0..4")
        if self.max_relayed_peers < 0:
            raise ConfigError("nat.max_relayed_peers must be at least 0")
        for addr in self.relays:
            if "/p2p/" not in addr:
                raise ConfigError(f"relay address {addr!r} lacks /p2p/<peer id>")


@dataclass(frozen=True)
class NodeConfig:
    listen: tuple[str, ...] = ("/ip4/0.0.0.0/tcp/4001",)
    """Multiaddrs to listen on; ``/tcp/0`` picks a free port."""
    announce: tuple[str, ...] = ()
    """Addresses told to peers instead of the listen addresses (NAT, containers)."""
    bootstrap: tuple[str, ...] = ()
    """Multiaddrs with ``/p2p/<peer id>`` of nodes to join through."""
    mdns: bool = False
    """Also find peers on the local link by multicast DNS.

    Works where multicast reaches the other hosts: one LAN segment or one
    machine. It does not cross routers, and most cloud networks and
    container bridges drop multicast; use ``bootstrap`` there."""
    key_file: str | None = None
    """Ed25519 key file (created 0600 when missing); ``None`` = new identity each start."""
    engine: str = "llama-cpp"
    """Engine entry point name (see :mod:`p2pinfer.engines.registry`); the
    ``simulated`` engine is chosen by name only."""
    engine_options: Mapping[str, Any] = field(default_factory=dict)
    router: RouterConfig = field(default_factory=RouterConfig)
    swarm_secret: bytes | None = None
    """Keys the block hashes (digests reveal nothing without it)."""
    private_network: bool = False
    """Also derive a libp2p pre-shared key from ``swarm_secret`` (pnet): outsiders cannot connect."""
    max_hops: int = 1
    """Forwards a request may take; 1 means the target always serves it itself."""
    max_frame_bytes: int = MAX_FRAME_BYTES
    max_inflight_forwards: int = 64
    """Forwarded requests this node serves at once before it answers BUSY."""
    max_streams_per_peer: int = 32
    """Generate streams one peer may hold open to this node; the next one is answered
    BUSY ("too many streams") and closed, so one peer cannot take every slot."""
    max_peers: int = 64
    """Connections this node opens itself (inbound ones are not limited here)."""
    request_timeout_s: float = 300.0
    """Default deadline of a whole generation."""
    stall_timeout_s: float = 60.0
    """A forward that sends nothing for this long is given up (and retried elsewhere)."""
    connect_timeout_s: float = 10.0
    stream_idle_s: float = 30.0
    """Idle forwarding streams are closed after this (the serving side waits twice as long)."""
    rtt_interval_s: float = 2.0
    """RTT probes of a new peer this often; the shortest interval (a probe off the smoothed RTT, or failed, halves the wait down to this)."""
    rtt_max_interval_s: float = 30.0
    """RTT probes back off, doubling, to this interval while a peer's RTT is stable."""
    discovery: str = "gossip"
    """``gossip``: digests of every cache on one topic (every node learns every
    change); ``directory``: the prefix directory (``/p2pinfer/directory/1.0.0``,
    KadDHT placement), no digests published; ``auto``: registers with the
    directory always, gossips digests while the swarm is smaller than
    ``auto_directory_nodes`` and queries the directory from that size on."""
    directory: DirectoryConfig = LIVE_DIRECTORY
    auto_directory_nodes: int = AUTO_DIRECTORY_NODES
    load_topic_nodes: int = 8
    """While the node queries the directory, its load reports go on one of
    about ``swarm / load_topic_nodes`` load topics (a power of two;
    :mod:`p2pinfer.core.load_topics`), so the reports a node hears stay
    about this many whatever the swarm's size."""
    nat: NatConfig = field(default_factory=NatConfig)
    """Reachability, relays and hole punching."""

    def __post_init__(self) -> None:
        if not self.listen:
            raise ConfigError("listen: at least one multiaddr is needed")
        for addr in self.bootstrap:
            if "/p2p/" not in addr:
                raise ConfigError(f"bootstrap address {addr!r} lacks /p2p/<peer id>")
        if self.private_network and not self.swarm_secret:
            raise ConfigError("private_network needs swarm_secret")
        if not 1 <= self.max_hops <= 4:
            raise ConfigError("max_hops must be in 1..4")
        if not 4096 <= self.max_frame_bytes <= 64 << 20:
            raise ConfigError("max_frame_bytes must be in 4 KiB..64 MiB")
        for name in ("max_inflight_forwards", "max_streams_per_peer", "max_peers"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1")
        for name in ("request_timeout_s", "stall_timeout_s", "connect_timeout_s", "stream_idle_s", "rtt_interval_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be positive")
        if self.discovery not in DISCOVERY_MODES:
            raise ConfigError(f"discovery must be one of {', '.join(DISCOVERY_MODES)}, not {self.discovery!r}")
        if self.load_topic_nodes < 1:
            raise ConfigError("load_topic_nodes must be at least 1")
        if self.auto_directory_nodes < 2:
            raise ConfigError("auto_directory_nodes must be at least 2")
        if self.directory.placement != "kademlia":
            raise ConfigError("a live node places anchors by KadDHT only (directory.placement = 'kademlia')")
        if self.rtt_max_interval_s < self.rtt_interval_s:
            raise ConfigError("rtt_max_interval_s must be at least rtt_interval_s")

    @property
    def gossip(self) -> GossipConfig:
        return self.router.gossip

    def replace(self, **changes: Any) -> NodeConfig:
        return replace(self, **changes)

    # -- JSON round trip (subprocess nodes, CLI config files) ----------------------
    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["swarm_secret"] = None if self.swarm_secret is None else self.swarm_secret.hex()
        out["engine_options"] = dict(self.engine_options)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NodeConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"unknown node config keys: {', '.join(sorted(unknown))}")
        kwargs: dict[str, Any] = dict(data)
        for key in ("listen", "announce", "bootstrap"):
            if key in kwargs:
                kwargs[key] = tuple(kwargs[key])
        if kwargs.get("swarm_secret") is not None:
            secret = kwargs["swarm_secret"]
            kwargs["swarm_secret"] = bytes.fromhex(secret) if isinstance(secret, str) else bytes(secret)
        if "router" in kwargs and isinstance(kwargs["router"], Mapping):
            r = dict(kwargs["router"])
            if isinstance(r.get("gossip"), Mapping):
                r["gossip"] = GossipConfig(**r["gossip"])
            if isinstance(r.get("trust"), Mapping):
                r["trust"] = TrustConfig(**r["trust"])
            if isinstance(r.get("verify"), Mapping):
                r["verify"] = VerifyConfig(**r["verify"])
            kwargs["router"] = RouterConfig(**r)
        if isinstance(kwargs.get("directory"), Mapping):
            try:
                kwargs["directory"] = DirectoryConfig(**kwargs["directory"])
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"directory: {exc}") from None
        if "nat" in kwargs and isinstance(kwargs["nat"], Mapping):
            nat = dict(kwargs["nat"])
            unknown_nat = set(nat) - {f.name for f in fields(NatConfig)}
            if unknown_nat:
                raise ConfigError(f"unknown nat config keys: {', '.join(sorted(unknown_nat))}")
            if "relays" in nat:
                nat["relays"] = tuple(nat["relays"])
            kwargs["nat"] = NatConfig(**nat)
        if "key_file" in kwargs and isinstance(kwargs["key_file"], Path):
            kwargs["key_file"] = str(kwargs["key_file"])
        return cls(**kwargs)
