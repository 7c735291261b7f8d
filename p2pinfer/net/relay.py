"""Circuit relay v2 for volunteers behind NAT: the relay (hop) side.

py-libp2p's :class:`~libp2p.relay.circuit_v2.protocol.CircuitV2Protocol`
does the wire protocol, the reservations (``RelayResourceManager``:
vouchers, TTL, refresh) and the stop side every node needs to accept a
relayed connection. :class:`InferenceRelay` keeps all of that and replaces
the two hop handlers, because in 0.8.1:

* circuits are bookkept in ``_active_relays`` keyed by peer id, so two
  circuits to the same NATed peer (two origins forwarding to one holder,
  the normal case here) overwrite each other's entry, and when one ends its
  clean-up closes the *other* circuit's streams;
* the hop stream loop keeps reading after a circuit ends and logs
  "malformed message" errors for every closed circuit;
* nothing counts the bytes relayed, and there is no total circuit limit.

Our ``_handle_connect`` keeps one record per circuit, applies the
per-reservation circuit limit (``relay_max_circuits_per_peer``), a total
(``relay_max_circuits``), and a shared byte budget and deadline per circuit
(``relay_circuit_max_bytes``, ``relay_circuit_max_duration_s``), and counts
what it copies. The relay copies the bytes of the end-to-end Noise session
of the two peers: it never holds their keys (``taps`` lets the lab look at
exactly what it copies, to prove that).

The hop side is switched on and off at run time (:meth:`enable_hop`), so
that ``relay_service = "auto"`` offers it only while the node is publicly
reachable.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
import itertools
import logging
import time
from typing import Any

import trio

from libp2p.abc import IHost, INetStream
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2.pb.circuit_pb2 import HopMessage, Limit, PeerId as CircuitPeerId, StopMessage
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_PROTOCOL
from libp2p.relay.circuit_v2.protocol import STOP_PROTOCOL_ID, CircuitV2Protocol, _is_relayed_stream
from libp2p.relay.circuit_v2.protocol_buffer import StatusCode
from libp2p.relay.circuit_v2.resources import RelayLimits
from libp2p.relay.circuit_v2.utils import read_delimited_msg, write_delimited_msg

from .config import NatConfig

__all__ = ["HOP_PROTOCOL", "STOP_PROTOCOL_ID", "InferenceRelay", "relay_limits"]

log = logging.getLogger(__name__)

_READ_CHUNK = 64 * 1024
_HANDSHAKE_TIMEOUT_S = 15.0

Tap = Callable[[str, str, bytes], None]
"""Called with (source peer, destination peer, bytes) for every chunk the relay copies."""


def relay_limits(config: NatConfig) -> RelayLimits:
    return RelayLimits(
        duration=int(config.relay_circuit_max_duration_s),
        data=config.relay_circuit_max_bytes,
        max_circuit_conns=config.relay_max_circuits_per_peer,
        max_reservations=config.relay_max_reservations,
        reservation_ttl=int(config.relay_reservation_ttl_s),
    )


@dataclass
class _Circuit:
    number: int
    src: str
    dst: str
    started: float
    bytes: int = 0
    ended: str = ""


@dataclass
class RelayStats:
    circuits_opened: int = 0
    circuits_refused: Counter[str] = field(default_factory=Counter)
    circuits_ended: Counter[str] = field(default_factory=Counter)
    bytes_relayed: int = 0
    reservations_handled: int = 0


class InferenceRelay(CircuitV2Protocol):
    def __init__(self, host: IHost, config: NatConfig) -> None:
        super().__init__(host, limits=relay_limits(config), allow_hop=False)
        self.config = config
        self.circuits: dict[int, _Circuit] = {}
        self.stats = RelayStats()
        self.taps: list[Tap] = []
        self._numbers = itertools.count(1)

    # -- switching the service -------------------------------------------------------------
    @property
    def hop_enabled(self) -> bool:
        return self.allow_hop

    def enable_hop(self) -> None:
        if not self.allow_hop:
            self.host.set_stream_handler(HOP_PROTOCOL, self._handle_hop_stream)
            self.allow_hop = True
            log.info("relay service on")

    def disable_hop(self) -> None:
        """No new reservations or circuits; circuits in use run on until they end."""
        if self.allow_hop:
            self.host.remove_stream_handler(HOP_PROTOCOL)
            self.allow_hop = False
            log.info("relay service off")

    def reservations_active(self) -> int:
        manager = self.resource_manager
        return sum(1 for r in manager._reservations.values() if not r.is_expired())

    # -- stop side: a relayed connection arrives ----------------------------------------------
    async def handle_incoming_connection(self, stream: INetStream, remote_peer_id: bytes) -> None:
        """Upgrade the stop stream to a connection, tagged with the *relay's* circuit address.

        py-libp2p tags it ``/p2p/<our own id>/p2p-circuit/p2p/<remote>``, so
        the accepting side could not tell which relay carries it.
        """
        import multiaddr

        from libp2p.connection_types import ConnectionType
        from libp2p.network.connection.raw_connection import RawConnection

        try:
            peer_id = ID(remote_peer_id)
            relay_id = stream.muxed_conn.peer_id
            ma = multiaddr.Multiaddr(f"/p2p/{relay_id.to_base58()}/p2p-circuit/p2p/{peer_id.to_base58()}")
            raw = RawConnection(stream=stream, initiator=False, connection_type=ConnectionType.RELAYED, addresses=[ma])
            muxed = await self.host.upgrade_inbound_connection(raw, ma)
            for conn in self.host.get_network().get_connections(peer_id):
                if getattr(conn, "muxed_conn", None) is muxed:
                    conn.set_transport_info([ma], ConnectionType.RELAYED)
                    break
        except Exception as exc:
            log.debug("relayed connection from %s not upgraded: %s: %s", remote_peer_id, type(exc).__name__, exc,
                      exc_info=True)
            await self._close_stream(stream)
            raise ConnectionError(f"Failed to handle incoming connection: {type(exc).__name__}: {exc}") from None

    # -- hop streams: one exchange per stream ------------------------------------------------
    async def _handle_hop_stream(self, stream: INetStream) -> None:
        if _is_relayed_stream(stream):
            await self._refuse(stream, StatusCode.PERMISSION_DENIED, "relayed")
            return
        try:
            with trio.fail_after(_HANDSHAKE_TIMEOUT_S):
                msg = await read_delimited_msg(stream, HopMessage)
        except Exception as exc:  # timeout, oversized, garbage, reset
            log.debug("hop stream from %s dropped: %s", stream.muxed_conn.peer_id, exc)
            await self._refuse(stream, StatusCode.MALFORMED_MESSAGE, "malformed")
            return
        if not self.allow_hop:
            await self._refuse(stream, StatusCode.PERMISSION_DENIED, "service off")
            return
        if msg.type == HopMessage.RESERVE:
            self.stats.reservations_handled += 1
            await self._handle_reserve(stream, msg)  # py-libp2p's, unchanged
            await self._close_stream(stream)
        elif msg.type == HopMessage.CONNECT:
            await self._handle_connect(stream, msg)
        else:
            await self._refuse(stream, StatusCode.MALFORMED_MESSAGE, "malformed")

    async def _refuse(self, stream: INetStream, code: StatusCode, reason: str, text: str = "") -> None:
        self.stats.circuits_refused[reason] += 1
        await self._send_status(stream, code, text or reason)
        with trio.CancelScope(shield=True), trio.move_on_after(2):
            try:
                await stream.reset()
            except Exception:
                pass

    async def _handle_connect(self, stream: INetStream, msg: HopMessage) -> None:
        src_id = stream.muxed_conn.peer_id
        try:
            dst_id = ID(msg.peer.id)
        except Exception:
            await self._refuse(stream, StatusCode.MALFORMED_MESSAGE, "malformed", "bad destination peer id")
            return
        manager = self.resource_manager
        if msg.HasField("reservation") and not manager.verify_reservation(src_id, msg.reservation):
            await self._refuse(stream, StatusCode.PERMISSION_DENIED, "bad reservation")
            return
        if len(self.circuits) >= self.config.relay_max_circuits:
            await self._refuse(stream, StatusCode.RESOURCE_LIMIT_EXCEEDED, "relay full",
                               f"this relay carries {len(self.circuits)} circuits, its limit")
            return
        reservation = manager.get_reservation(dst_id)
        if reservation is None:
            await self._refuse(stream, StatusCode.NO_RESERVATION, "no reservation",
                               "the destination holds no reservation on this relay")
            return
        if not reservation.can_accept_connection():
            await self._refuse(stream, StatusCode.RESOURCE_LIMIT_EXCEEDED, "peer circuit limit",
                               f"the destination already has {reservation.active_connections} circuits here")
            return
        reservation.active_connections += 1  # taken before any await: no race past the limit
        circuit = _Circuit(next(self._numbers), src_id.to_base58(), dst_id.to_base58(), time.monotonic())
        self.circuits[circuit.number] = circuit
        dst_stream: INetStream | None = None
        opened = False
        try:
            limit = Limit(duration=self.limits.duration, data=self.limits.data)
            try:
                with trio.fail_after(_HANDSHAKE_TIMEOUT_S):
                    dst_stream = await self.host.new_stream(dst_id, [STOP_PROTOCOL_ID])
                    await write_delimited_msg(
                        dst_stream,
                        StopMessage(type=StopMessage.CONNECT, peer=CircuitPeerId(id=src_id.to_bytes()), limit=limit),
                    )
                    resp = await read_delimited_msg(dst_stream, StopMessage)
                status = StatusCode(resp.status) if resp.HasField("status") else StatusCode.OK
                if status != StatusCode.OK:
                    raise ConnectionError(f"the destination answered {status.name}")
            except Exception as exc:
                circuit.ended = "destination unreachable"
                await self._refuse(stream, StatusCode.CONNECTION_FAILED, "destination unreachable", str(exc))
                return
            await self._send_status(stream, StatusCode.OK, "circuit open", limit=limit)
            self.stats.circuits_opened += 1
            opened = True
            await self._splice(stream, dst_stream, circuit)
        finally:
            manager.release_connection(dst_id)
            self.circuits.pop(circuit.number, None)
            if opened:
                self.stats.circuits_ended[circuit.ended or "closed"] += 1
            ok = circuit.ended in ("", "closed")
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                for s in (stream, dst_stream):
                    if s is None:
                        continue
                    try:
                        await (s.close() if ok else s.reset())
                    except Exception:
                        pass

    async def _splice(self, a: INetStream, b: INetStream, circuit: _Circuit) -> None:
        """Copy both ways until either side ends or a limit is reached."""
        budget = [self.limits.data] if self.limits.data > 0 else None

        async def pump(src: INetStream, dst: INetStream, src_id: str, dst_id: str, scope: trio.CancelScope) -> None:
            try:
                while True:
                    try:
                        data = await src.read(_READ_CHUNK)
                    except Exception:
                        data = b""
                    if not data:
                        circuit.ended = circuit.ended or "closed"
                        return
                    if budget is not None:
                        budget[0] -= len(data)
                        if budget[0] < 0:
                            circuit.ended = "data limit"
                            return
                    for tap in self.taps:
                        tap(src_id, dst_id, data)
                    circuit.bytes += len(data)
                    self.stats.bytes_relayed += len(data)
                    try:
                        with trio.fail_after(self.write_timeout):
                            await dst.write(data)
                    except Exception:
                        circuit.ended = circuit.ended or "closed"
                        return
            finally:
                scope.cancel()

        with trio.move_on_after(self.limits.duration if self.limits.duration > 0 else float("inf")) as timer:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(pump, a, b, circuit.src, circuit.dst, nursery.cancel_scope)
                nursery.start_soon(pump, b, a, circuit.dst, circuit.src, nursery.cancel_scope)
        if timer.cancelled_caught:
            circuit.ended = "duration limit"

    def as_dict(self) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "offered": self.allow_hop,
            "reservations": self.reservations_active(),
            "circuits": [
                {"src": c.src, "dst": c.dst, "bytes": c.bytes, "age_s": round(now - c.started, 3)}
                for c in self.circuits.values()
            ],
            "circuits_opened": self.stats.circuits_opened,
            "circuits_refused": dict(self.stats.circuits_refused),
            "circuits_ended": dict(self.stats.circuits_ended),
            "bytes_relayed": self.stats.bytes_relayed,
            "limits": {
                "max_reservations": self.config.relay_max_reservations,
                "max_circuits": self.config.relay_max_circuits,
                "max_circuits_per_peer": self.config.relay_max_circuits_per_peer,
                "circuit_max_bytes": self.config.relay_circuit_max_bytes,
                "circuit_max_duration_s": self.config.relay_circuit_max_duration_s,
                "reservation_ttl_s": self.config.relay_reservation_ttl_s,
            },
        }
