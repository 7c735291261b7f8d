"""No pubsub stream over a relayed-only connection, and so no open-close churn through the relay (issue 17).

py-libp2p 0.8.1 reopens a peer's pubsub stream at once when it ends while the peer is
still connected; the node's watch closed every stream over a relayed connection, so the
two churned a stream every 0.5 s through the relay (3.9 KB/s per idle relayed pair,
docs/results/issue17-relay-idle/relay_idle_causes_lab.json). CountingPubsub refuses to
open one where every connection to the peer is relayed.
"""

from __future__ import annotations

import trio

from libp2p.network.exceptions import SwarmException
from libp2p.peer.id import ID

from p2pinfer.net.counters import NodeCounters
from p2pinfer.net.host import CountingPubsub

RELAYED = "/ip4/198.51.100.10/tcp/4001/p2p/12D3KooWRelay/p2p-circuit"
DIRECT = "/ip4/192.0.2.7/tcp/4001"


class FakeConn:
    def __init__(self, addr: str) -> None:
        self.addr = addr

    def get_transport_addresses(self) -> list[str]:
        return [self.addr]


class FakeHost:
    def __init__(self, *addrs: str) -> None:
        self.conns = [FakeConn(a) for a in addrs]
        self.streams_opened = 0

    def get_network(self) -> "FakeHost":
        return self

    def get_connections(self, peer_id: ID) -> list[FakeConn]:
        return self.conns

    async def new_stream(self, peer_id: ID, protocols: list[str]) -> None:
        self.streams_opened += 1
        raise SwarmException("no stream in this test")


class FakeRouter:
    def get_protocols(self) -> list[str]:
        return ["/meshsub/1.1.0"]


def _pubsub(host: FakeHost) -> CountingPubsub:
    pubsub = object.__new__(CountingPubsub)  # only what _handle_new_peer reads
    pubsub.host = host
    pubsub.peers = {}
    pubsub.blacklisted_peers = set()
    pubsub.counters = NodeCounters()
    pubsub.router = FakeRouter()
    return pubsub


def _register(pubsub: CountingPubsub) -> None:
    """py-libp2p's registration as the dead-peer path runs it: retried while the peer is connected."""
    trio.run(pubsub._handle_new_peer_with_retry, ID(b"\x00\x24peer-behind-a-symmetric-nat"), 1.2)


def test_no_pubsub_stream_to_a_peer_reached_only_through_a_relay():
    host = FakeHost(RELAYED)
    pubsub = _pubsub(host)
    _register(pubsub)
    assert host.streams_opened == 0
    assert pubsub.counters.pubsub_relayed_refused == 1


def test_a_peer_with_a_direct_connection_still_gets_its_pubsub_stream():
    for addrs in ((DIRECT,), (RELAYED, DIRECT)):
        host = FakeHost(*addrs)
        pubsub = _pubsub(host)
        _register(pubsub)
        assert host.streams_opened >= 1
        assert pubsub.counters.pubsub_relayed_refused == 0
