"""How this node reaches each peer: direct, hole-punched or relayed.

:class:`Connector` opens a connection to a peer: a direct dial first; when
that is impossible (the peer is behind NAT) a dial through one of the
relays the peer holds a reservation on (its circuit addresses come in its
signed gossip). py-libp2p's swarm never dials ``/p2p-circuit`` addresses by
itself (``Swarm.dial_peer`` filters them out), so the circuit dial goes
through :class:`~libp2p.relay.circuit_v2.transport.CircuitV2Transport`
explicitly.

:class:`HolePuncher` is py-libp2p's DCUtR (``libp2p.relay.circuit_v2.dcutr``)
with three changes, all by subclassing:

* it records every hole punch (who, when, how long, whether it worked), so
  the path of a peer can say ``hole-punched`` and the lab can report a
  success rate per NAT type;
* only the side that *accepted* the relayed connection starts a hole punch,
  as the DCUtR spec says (upstream's auto-drive loop starts one from both
  sides, every two seconds, which doubles every attempt);
* the "unilateral upgrade" (a plain direct dial before DCUtR) is skipped for
  a peer that gossips that it is not publicly reachable: our connector has
  just tried that dial, and upstream spends ``dial_timeout`` on it again.

DCUtR in py-libp2p 0.8.1 punches TCP only (no QUIC here) and predicts the
peer's external address as *its NAT's address with its listen port*: it
works behind a port-preserving NAT and cannot work behind a symmetric one
(``--random-fully``), where the peers stay on the relay.

:class:`PathTracker` names the path of every connected peer and tells the
node when it changes (so the RTT estimate restarts, and idle forwarding
streams move to the new connection).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
import logging
import time
from typing import Any

import multiaddr
import trio

from libp2p.abc import IHost, INetConn
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.relay.circuit_v2.dcutr import DCUtRProtocol, MAX_HOLE_PUNCH_ATTEMPTS
from libp2p.relay.circuit_v2.transport import CircuitV2Transport

from .connections import connections_of, is_relayed, relay_of

__all__ = ["DIRECT", "HOLE_PUNCHED", "PATHS", "RELAYED", "ConnectFailed", "Connector", "HolePuncher", "PathTracker"]

log = logging.getLogger(__name__)

DIRECT = "direct"
HOLE_PUNCHED = "hole-punched"
RELAYED = "relayed"
PATHS = (DIRECT, HOLE_PUNCHED, RELAYED)

_DIRECT_BACKOFF_S = 30.0
"""After a failed direct dial, go straight to the relay for this long."""
_RELAY_CLOSE_GRACE_S = 10.0
"""After a hole punch, the relayed connection closes after this (upstream: 60 s)."""


class ConnectFailed(Exception):
    pass


@dataclass
class PunchRecord:
    peer: str
    at: float
    seconds: float
    ok: bool
    role: str
    """``initiator`` (we started it) or ``responder``."""


class HolePuncher(DCUtRProtocol):
    def __init__(self, host: IHost, *, peer_is_private: Callable[[str], bool], dial_timeout: int = 5) -> None:
        super().__init__(host, dial_timeout=dial_timeout)
        self._peer_is_private = peer_is_private
        self.records: list[PunchRecord] = []
        self.punched_conns: dict[str, set[int]] = {}
        """id() of the direct connections each hole punch produced, by peer."""
        self._driving: set[ID] = set()
        self._punching: dict[str, set[int]] = {}
        """Peers being punched now: id() of their direct connections before the punch."""

    async def _perform_hole_punch(self, peer_id: ID, addrs: list[multiaddr.Multiaddr], as_responder: bool = False) -> bool:
        peer = peer_id.to_base58()
        before = {id(c) for c in connections_of(self.host, peer_id) if not is_relayed(c)}
        self._punching[peer] = before
        t0 = time.monotonic()
        try:
            ok = await super()._perform_hole_punch(peer_id, addrs, as_responder)
        finally:
            self._punching.pop(peer, None)
        # as_responder=True means we initiated the DCUtR exchange (upstream's naming).
        self.records.append(PunchRecord(peer, t0, time.monotonic() - t0, ok, "initiator" if as_responder else "responder"))
        del self.records[:-1024]
        if ok:
            new = {id(c) for c in connections_of(self.host, peer_id) if not is_relayed(c)} - before
            self.punched_conns.setdefault(peer, set()).update(new)
        log.info("hole punch with %s: %s in %.2f s", peer, "ok" if ok else "failed", time.monotonic() - t0)
        return ok

    def made_by_punch(self, peer: str, conn: Any) -> bool:
        """Whether a direct connection came from a hole punch (finished, or under way now)."""
        if id(conn) in self.punched_conns.get(peer, ()):
            return True
        before = self._punching.get(peer)
        return before is not None and id(conn) not in before

    async def _try_unilateral_upgrade(self, peer_id: ID) -> bool:
        if self._peer_is_private(peer_id.to_base58()):
            return False
        return await super()._try_unilateral_upgrade(peer_id)

    def _schedule_relay_close(self, peer_id: ID) -> None:
        if self._nursery is not None:
            self._nursery.start_soon(self._close_relayed_conns_after_grace, peer_id, _RELAY_CLOSE_GRACE_S)

    async def _auto_drive_loop(self) -> None:
        """Start a hole punch for each relayed connection we accepted (DCUtR spec: B initiates)."""
        while True:
            await trio.sleep(1.0)
            for pid in list(self.host.get_connected_peers()):
                if pid in self._driving or pid in self._in_progress or self._hole_punch_attempts.get(pid, 0) >= MAX_HOLE_PUNCH_ATTEMPTS:
                    continue
                conns = connections_of(self.host, pid)
                if not conns or any(not is_relayed(c) for c in conns):
                    continue
                if not any(str(getattr(c, "direction", "")).lower().endswith("inbound") for c in conns):
                    continue
                if self._nursery is not None:
                    self._driving.add(pid)
                    self._nursery.start_soon(self._drive, pid)

    async def _drive(self, pid: ID) -> None:
        try:
            await self.initiate_hole_punch(pid)
        except Exception as exc:
            log.debug("hole punch with %s: %s", pid, exc)
        finally:
            self._driving.discard(pid)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"attempts": len(self.records), "succeeded": sum(r.ok for r in self.records)}
        out["by_peer"] = {}
        for r in self.records:
            entry = out["by_peer"].setdefault(r.peer, {"attempts": 0, "succeeded": 0, "seconds": []})
            entry["attempts"] += 1
            entry["succeeded"] += int(r.ok)
            entry["seconds"].append(round(r.seconds, 3))
        return out


class PathTracker:
    """The path of each connected peer, and a callback when it changes."""

    def __init__(self, host: IHost, puncher: HolePuncher | None, on_change: Callable[[str, str | None, str | None], None]) -> None:
        self.host = host
        self.puncher = puncher
        self._on_change = on_change
        self.paths: dict[str, str] = {}
        self.changes: Counter[str] = Counter()

    def path_of_conn(self, peer: str, conn: INetConn) -> str:
        if is_relayed(conn):
            return RELAYED
        if self.puncher is not None and self.puncher.made_by_punch(peer, conn):
            return HOLE_PUNCHED
        return DIRECT

    def best_conn(self, peer: str) -> INetConn | None:
        """The connection new streams go on (py-libp2p prefers direct over relayed)."""
        conns = connections_of(self.host, peer)
        if not conns:
            return None
        direct = [c for c in conns if not is_relayed(c)]
        return (direct or conns)[-1]

    def path(self, peer: str) -> str | None:
        conns = connections_of(self.host, peer)
        if not conns:
            return None
        kinds = {self.path_of_conn(peer, c) for c in conns}
        for kind in (HOLE_PUNCHED, DIRECT, RELAYED):
            if kind in kinds:
                return kind
        return None

    def relays_of(self, peer: str) -> list[str]:
        return [r for c in connections_of(self.host, peer) if (r := relay_of(c))]

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await trio.sleep(0.5)
            self.update()

    def update(self) -> None:
        current: dict[str, str] = {}
        for pid in self.host.get_connected_peers():
            peer = pid.to_base58()
            path = self.path(peer)
            if path is not None:
                current[peer] = path
        for peer in set(current) | set(self.paths):
            old, new = self.paths.get(peer), current.get(peer)
            if old != new:
                self.changes[f"{old}->{new}"] += 1
                try:
                    self._on_change(peer, old, new)
                except Exception:
                    log.exception("path change callback")
        if self.puncher is not None:  # forget the connections that are gone
            for peer, ids in list(self.puncher.punched_conns.items()):
                live = {id(c) for c in connections_of(self.host, peer)}
                ids &= live
                if not ids:
                    del self.puncher.punched_conns[peer]
        self.paths = current


class Connector:
    """Opens a connection to a peer: direct if possible, else through its relays."""

    def __init__(
        self,
        *,
        host: IHost,
        transport: CircuitV2Transport,
        addrs_of: Callable[[str], tuple[list[str], list[str]]],
        timeout_s: float,
    ) -> None:
        self.host = host
        self.transport = transport
        self._addrs_of = addrs_of
        self.timeout_s = timeout_s
        self._direct_failed_until: dict[str, float] = {}
        self._locks: dict[str, trio.Lock] = {}
        self.relayed_dials = Counter[str]()

    def can_relay(self, peer: str) -> bool:
        return bool(self._addrs_of(peer)[1])

    async def ensure(self, peer: str, *, deadline: float | None = None, allow_relay: bool = True) -> None:
        """Until ``peer`` is connected; raises :class:`ConnectFailed` saying what was tried."""
        if connections_of(self.host, peer):
            return
        lock = self._locks.setdefault(peer, trio.Lock())
        async with lock:
            try:
                await self._connect(peer, deadline, allow_relay)
            finally:
                if not lock.statistics().tasks_waiting:
                    self._locks.pop(peer, None)

    def _timeout(self, deadline: float | None) -> float:
        if deadline is None:
            return self.timeout_s
        return max(0.05, min(self.timeout_s, deadline - trio.current_time()))

    async def _connect(self, peer: str, deadline: float | None, allow_relay: bool) -> None:
        if connections_of(self.host, peer):
            return
        direct, circuits = self._addrs_of(peer)
        pid = ID.from_base58(peer)
        errors: list[str] = []
        now = time.monotonic()
        if direct and (self._direct_failed_until.get(peer, 0.0) <= now or not circuits or not allow_relay):
            try:
                info = PeerInfo(pid, [multiaddr.Multiaddr(a) for a in direct])
                with trio.fail_after(self._timeout(deadline)):
                    await self.host.connect(info)
                self._direct_failed_until.pop(peer, None)
                return
            except Exception as exc:  # unreachable, refused, timed out, wrong peer
                self._direct_failed_until[peer] = time.monotonic() + _DIRECT_BACKOFF_S
                errors.append(f"direct: {type(exc).__name__}: {exc}")
        if allow_relay:
            for circuit in circuits:
                try:
                    with trio.fail_after(self._timeout(deadline)):
                        await self.transport.dial(multiaddr.Multiaddr(f"{circuit}/p2p/{peer}"))
                    self.relayed_dials["ok"] += 1
                    return
                except Exception as exc:
                    self.relayed_dials["failed"] += 1
                    errors.append(f"via {circuit}: {type(exc).__name__}: {exc}")
        if not errors:
            errors.append("no address known" if not (direct or circuits) else "relay not allowed")
        raise ConnectFailed("; ".join(errors))
