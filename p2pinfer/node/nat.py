"""A live node's NAT traversal: reachability, relay (both sides), hole punching, paths.

:meth:`NodeNat._build_nat` makes the services (before the forwarding client,
which dials through :class:`~p2pinfer.net.paths.Connector`);
:meth:`NodeNat._run_nat` starts them once the host runs. What reaches the
rest of the node: the NAT facts in our load reports, the path (direct,
hole-punched, relayed) of each peer and of each forwarding stream.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AsyncExitStack
import logging
from typing import Any

import trio

from ..net.config import NodeConfig
from ..net.counters import NodeCounters

__all__ = ["NodeNat"]

log = logging.getLogger("p2pinfer.node")


class NodeNat:
    """A mixin of :class:`~p2pinfer.node.Node`: reaching and being reached behind NAT."""

    config: NodeConfig
    counters: NodeCounters
    host: Any
    membership: Any
    gossip: Any
    forward_client: Any
    _libp2p: Any
    _nursery: trio.Nursery | None
    _dial_addrs: Callable[[], list[str]]

    def _build_nat(self) -> None:
        from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole
        from libp2p.relay.circuit_v2.transport import CircuitV2Transport

        from ..net.membership import split_p2p_addr
        from ..net.paths import Connector, HolePuncher, PathTracker
        from ..net.reachability import Reachability
        from ..net.relay import InferenceRelay
        from ..net.relay_client import RelayReservations

        config = self.config
        nat = config.nat
        host = self.host
        self.relay = InferenceRelay(host, nat)
        # STOP only: a dial through a relay must not take a reservation there.
        self.circuit_transport = CircuitV2Transport(host, self.relay, RelayConfig(roles=RelayRole.STOP))
        self.hole_puncher = (
            HolePuncher(host, peer_is_private=lambda p: self.membership.reachability_of(p) == "private")
            if nat.hole_punching
            else None
        )
        self.paths = PathTracker(host, self.hole_puncher, self._on_path_change)
        self.connector = Connector(
            host=host,
            transport=self.circuit_transport,
            addrs_of=lambda p: self.membership.addrs_of(p),
            timeout_s=config.connect_timeout_s,
        )
        self.reachability = Reachability(
            host=host,
            mode=nat.reachability,
            interval_s=nat.reachability_interval_s,
            servers=nat.reachability_servers,
            dial_timeout_s=min(5.0, config.connect_timeout_s),
            own_addrs=self._dial_addrs,
            counters=self.counters,
            on_change=self._on_reachability,
        )
        self.relay_reservations = RelayReservations(
            host=host,
            config=nat,
            want=lambda: self.reachability.status == "private",
            candidates=self._relay_candidates,
            addrs_of=lambda p: self.membership.addrs_of(p)[0],
            on_change=self._announce_soon,
        )
        self._static_relays = [split_p2p_addr(a) for a in nat.relays]

    def _learn_static_relays(self) -> None:
        for transport, relay_id in self._static_relays:
            self.membership.learn(relay_id, (transport,))

    async def _run_nat(self, stack: AsyncExitStack) -> None:
        """The relay and DCUtR services (stopped before the host closes: the stack unwinds in reverse)."""
        from libp2p.tools.anyio_service import background_trio_service

        nat = self.config.nat
        await stack.enter_async_context(background_trio_service(self.relay))
        if self.hole_puncher is not None:
            await stack.enter_async_context(background_trio_service(self.hole_puncher))
        if nat.relay_service == "on" or (nat.relay_service == "auto" and self.reachability.status == "public"):
            self.relay.enable_hop()

    async def _start_nat_tasks(self, nursery: trio.Nursery) -> None:
        await nursery.start(self.paths.run)
        await nursery.start(self.reachability.run)
        await nursery.start(self.relay_reservations.run)
        nursery.start_soon(self._pubsub_watch)

    def _nat_facts(self) -> dict[str, Any]:
        """What our load reports say about reaching us."""
        return {
            "reachability": self.reachability.status,
            "relay_addrs": self.relay_reservations.circuit_addrs(),
            "relay_service": self.relay.hop_enabled,
        }

    def _nat_status(self) -> dict[str, Any]:
        """The NAT part of ``/status``."""
        return {
            "reachability": self.reachability.as_dict(),
            "paths": {peer: self.paths.path(peer) for peer in sorted(self.membership.connected())},
            "relay_service": self.relay.as_dict(),
            "relay_reservations": self.relay_reservations.as_dict(),
            "hole_punching": None if self.hole_puncher is None else self.hole_puncher.summary(),
        }

    def _announce_soon(self) -> None:
        """Reachability or reservations changed: tell the swarm now, not at the next report."""
        if self._nursery is not None and hasattr(self, "gossip"):
            self._nursery.start_soon(self.gossip.publish_load)

    def _on_reachability(self, status: str) -> None:
        if self.config.nat.relay_service == "auto":
            if status == "public":
                self.relay.enable_hop()
            else:
                self.relay.disable_hop()
        self._announce_soon()

    def _relay_candidates(self) -> list[str]:
        static = [relay_id for _, relay_id in self._static_relays]
        return list(dict.fromkeys([*static, *self.membership.relays()]))

    def _path_of_stream(self, peer_id: str, stream: Any) -> str | None:
        from ..net.connections import swarm_conn_of

        conn = swarm_conn_of(self.host, stream)
        return None if conn is None else self.paths.path_of_conn(peer_id, conn)

    def _on_path_change(self, peer_id: str, old: str | None, new: str | None) -> None:
        if old is not None and new is not None:
            log.info("path to %s: %s -> %s", peer_id, old, new)
            if self._nursery is not None:
                # Idle forwarding streams still run on the old connection.
                self._nursery.start_soon(self.forward_client.drop_peer, peer_id)

    async def _pubsub_watch(self) -> None:
        """Keep each peer's pubsub stream on a live, direct connection.

        Gossip never needs a relay: every volunteer behind NAT is connected
        to the public nodes, which carry the gossip mesh. A pubsub stream
        that py-libp2p opened over a relayed connection (it opens one on
        every new connection) is closed, so the relay carries forwards and
        RTT probes only; when a hole punch gives a direct connection, the
        stream comes back by itself (pubsub opens one on each new
        connection to a peer it does not have). py-libp2p 0.8.1 reopens a
        closed stream at once while the peer is still connected: that is
        refused in ``CountingPubsub._handle_new_peer`` (without it the two
        churned a stream every 0.5 s, 3.9 KB/s per idle relayed pair). And py-libp2p's pubsub forgets a peer only
        when its *last* connection closes: a stream left on a connection
        that closed (the relayed one, after a hole punch) is dead while the
        peer stays, so it is reopened too.
        """
        from ..net.connections import connections_of, is_relayed, swarm_conn_of

        pubsub = self._libp2p.pubsub
        while True:
            await trio.sleep(0.5)
            for pid, stream in list(pubsub.peers.items()):
                conns = connections_of(self.host, pid)
                conn = swarm_conn_of(self.host, stream)
                direct = [c for c in conns if not is_relayed(c)]
                if conn is not None and not is_relayed(conn):
                    continue  # where it should be
                if conn is not None and not direct:
                    log.debug("pubsub stream to %s runs through a relay: closed", pid)
                    pubsub._handle_dead_peer(pid)
                    with trio.move_on_after(2):
                        try:
                            await stream.reset()
                        except Exception:
                            pass
                    continue
                if not direct:
                    continue  # its connection is gone and no direct one replaced it
                log.info("pubsub stream to %s is not on a live direct connection: reopening it", pid)
                pubsub._handle_dead_peer(pid)
                with trio.move_on_after(10):
                    try:
                        await pubsub._handle_new_peer(pid)
                    except Exception as exc:
                        log.debug("pubsub stream to %s not reopened: %s", pid, exc)
