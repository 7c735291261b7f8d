"""Keeping reservations on relays while this node is not publicly reachable.

A NATed node holds ``relay_reservations`` (default two) reservations on
relays, renews each at half its TTL, and when a relay disappears (its
connection drops and a re-dial fails, or a renewal is refused) moves to
another one. Its circuit addresses, ``<relay addr>/p2p/<relay>/p2p-circuit``,
go out in its signed load reports; identify cannot carry them
(``BasicHost.get_addrs()`` in py-libp2p 0.8.1 strips everything from the
first ``/p2p/`` of an announced address, turning a circuit address into the
relay's address with our peer id).

The RESERVE exchange is done here with py-libp2p's circuit v2 messages
rather than ``CircuitV2Transport._make_reservation``: that private helper
drops the relay's limit and addresses, and its refresher
(``_refresh_reservations_worker``) renews only 30 s before expiry and never
notices that a relay is gone.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
import logging
import time
from typing import Any

import multiaddr
import trio

from libp2p.abc import IHost
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.relay.circuit_v2.pb.circuit_pb2 import HopMessage, PeerId as CircuitPeerId
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_PROTOCOL
from libp2p.relay.circuit_v2.protocol_buffer import StatusCode
from libp2p.relay.circuit_v2.utils import read_delimited_msg, write_delimited_msg

from .config import NatConfig
from .connections import connections_of, is_relayed
from .framing import finish_stream

__all__ = ["RelayReservations", "ReservationError"]

log = logging.getLogger(__name__)

_TICK_S = 1.0
_RESERVE_TIMEOUT_S = 10.0
_RECONNECT_TIMEOUT_S = 3.0
_FAILED_BACKOFF_S = 30.0
_EVENTS = 256


class ReservationError(Exception):
    pass


@dataclass
class Reservation:
    relay: str
    addr: str
    """The relay's transport address (``/ip4/../tcp/..``) that peers dial."""
    expires_at: float
    """Unix time, as the relay says."""
    renew_at: float
    """Monotonic time of the next renewal."""
    since: float

    @property
    def circuit_addr(self) -> str:
        return f"{self.addr}/p2p/{self.relay}/p2p-circuit"


class RelayReservations:
    def __init__(
        self,
        *,
        host: IHost,
        config: NatConfig,
        want: Callable[[], bool],
        candidates: Callable[[], list[str]],
        addrs_of: Callable[[str], list[str]],
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.host = host
        self.config = config
        self._want = want
        self._candidates = candidates
        self._addrs_of = addrs_of
        self._on_change = on_change
        self.reservations: dict[str, Reservation] = {}
        self._failed_until: dict[str, float] = {}
        self.events: deque[dict[str, Any]] = deque(maxlen=_EVENTS)
        """What happened, with ``time.monotonic()`` stamps (the lab reads them)."""
        self.first_reserved_at: float | None = None
        self.reserved = 0
        self.lost = 0
        self.passes = 0
        """Keeper passes so far (one per ``_TICK_S`` at most): events carry it, so how soon a
        lost reservation was replaced can be counted in the keeper's own passes."""

    def circuit_addrs(self) -> list[str]:
        return [r.circuit_addr for r in self.reservations.values()]

    def _event(self, kind: str, relay: str, detail: str = "") -> None:
        self.events.append({"t": time.monotonic(), "pass": self.passes, "event": kind, "relay": relay, "detail": detail})

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            try:
                await self.tick()
            except Exception:  # never let the keeper die
                log.exception("relay reservation keeper")
            await trio.sleep(_TICK_S)

    async def tick(self) -> None:
        self.passes += 1
        wanted = self.config.relay_reservations if self._want() else 0
        if wanted == 0:
            if self.reservations:
                for relay in list(self.reservations):
                    self._drop(relay, "not needed: reachable directly")
                self._on_change()
            return
        changed = False
        now = time.monotonic()
        for res in list(self.reservations.values()):
            if not self._connected_directly(res.relay) and not await self._reconnect(res):
                self._drop(res.relay, "relay unreachable")
                self._failed_until[res.relay] = now + _FAILED_BACKOFF_S
                changed = True
            elif now >= res.renew_at:
                try:
                    await self._reserve(res.relay)
                    self._event("renewed", res.relay)
                except ReservationError as exc:
                    self._drop(res.relay, f"renewal failed: {exc}")
                    self._failed_until[res.relay] = now + _FAILED_BACKOFF_S
                    changed = True
        if len(self.reservations) < wanted:
            for relay in self._candidates():
                if len(self.reservations) >= wanted:
                    break
                if relay in self.reservations or self._failed_until.get(relay, 0.0) > time.monotonic():
                    continue
                if not self._connected_directly(relay):
                    continue
                try:
                    await self._reserve(relay)
                except ReservationError as exc:
                    self._failed_until[relay] = time.monotonic() + _FAILED_BACKOFF_S
                    self._event("refused", relay, str(exc))
                    log.info("reservation on %s failed: %s", relay, exc)
                    continue
                self.reserved += 1
                if self.first_reserved_at is None:
                    self.first_reserved_at = time.monotonic()
                self._event("reserved", relay)
                log.info("reserved a circuit slot on relay %s", relay)
                changed = True
        if changed:
            self._on_change()

    def _drop(self, relay: str, why: str) -> None:
        if self.reservations.pop(relay, None) is not None:
            self.lost += 1
            self._event("lost", relay, why)
            log.info("reservation on %s dropped: %s", relay, why)

    def _connected_directly(self, relay: str) -> bool:
        return any(not is_relayed(c) for c in connections_of(self.host, relay))

    async def _reconnect(self, res: Reservation) -> bool:
        addrs = [res.addr, *self._addrs_of(res.relay)]
        try:
            info = PeerInfo(ID.from_base58(res.relay), [multiaddr.Multiaddr(a) for a in dict.fromkeys(addrs)])
            with trio.fail_after(_RECONNECT_TIMEOUT_S):
                await self.host.connect(info)
        except Exception:
            return False
        # The relay keeps a reservation only while we are connected: renew now.
        res.renew_at = 0.0
        return self._connected_directly(res.relay)

    def _relay_transport_addr(self, relay: str) -> str | None:
        for conn in connections_of(self.host, relay):
            if is_relayed(conn):
                continue
            try:
                for addr in conn.get_transport_addresses():
                    text = str(addr).split("/p2p/")[0]
                    if text.startswith("/ip4/") or text.startswith("/ip6/"):
                        return text
            except Exception:
                continue
        return None

    async def _reserve(self, relay: str) -> Reservation:
        """One RESERVE exchange; raises :class:`ReservationError`."""
        addr = self._relay_transport_addr(relay)
        if addr is None:
            raise ReservationError("no direct connection to the relay")
        stream = None
        ok = False
        try:
            with trio.fail_after(_RESERVE_TIMEOUT_S):
                stream = await self.host.new_stream(ID.from_base58(relay), [HOP_PROTOCOL])
                await write_delimited_msg(
                    stream, HopMessage(type=HopMessage.RESERVE, peer=CircuitPeerId(id=self.host.get_id().to_bytes()))
                )
                resp = await read_delimited_msg(stream, HopMessage)
            ok = True
        except trio.TooSlowError:
            raise ReservationError("no answer in time") from None
        except Exception as exc:
            raise ReservationError(f"{type(exc).__name__}: {exc}") from None
        finally:
            if stream is not None:
                await finish_stream(stream, ok)
        status = StatusCode(resp.status) if resp.HasField("status") else StatusCode.UNUSED
        if status != StatusCode.OK or not resp.HasField("reservation"):
            raise ReservationError(f"relay answered {status.name}")
        now_wall, now = time.time(), time.monotonic()
        ttl = max(1.0, resp.reservation.expire - now_wall)
        res = self.reservations.get(relay)
        if res is None:
            res = self.reservations[relay] = Reservation(relay, addr, resp.reservation.expire, 0.0, now)
        res.addr = addr
        res.expires_at = resp.reservation.expire
        res.renew_at = now + ttl / 2
        return res

    def as_dict(self) -> dict[str, Any]:
        now_wall, now = time.time(), time.monotonic()
        return {
            "wanted": self.config.relay_reservations if self._want() else 0,
            "reservations": [
                {"relay": r.relay, "circuit_addr": r.circuit_addr, "expires_in_s": round(r.expires_at - now_wall, 1),
                 "held_s": round(now - r.since, 3)}
                for r in self.reservations.values()
            ],
            "reserved": self.reserved,
            "lost": self.lost,
        }
