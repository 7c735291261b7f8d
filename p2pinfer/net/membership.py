"""Who is in the swarm: dialing, discovery, liveness and round-trip times.

Peers are learned from the bootstrap list (kept and re-dialled for ever),
from load reports relayed by gossip (they carry the sender's addresses),
from the peer lists of digest pulls, and optionally from mDNS. A peer is
*in the view* while we hear from it (gossip, a pull, an RTT probe); it
leaves the view and the forwarding pool when

* its connection to us closes (seen within one :data:`_TICK_S` tick): a
  process that dies, even by SIGKILL, has its connections closed by its
  kernel, so it leaves the view of every peer connected to it at once;
* or it falls silent for ``peer_ttl_s`` (a machine that vanished without
  closing anything, a hung process, a peer we only hear through relays);

and it comes back as soon as it is heard again (a dropped connection is
re-dialled; a connected peer that is not in the view, or has no digest in
it, is pulled again, every ``keepalive_interval_s`` doubling to
:data:`_REPULL_MAX_S`).

A directly connected peer is *probed for liveness* once it has been silent
for ``peer_ttl_s - keepalive_interval_s``: an idle node whose every peer is
directly connected sends no keep-alives (:meth:`Membership.keepalive_wanted`,
issue 14), so a probe that succeeds is what keeps it in the view, and one
that fails leaves it to expire at ``peer_ttl_s`` as before.

RTT comes from the standard libp2p ping protocol over one long-lived stream per peer, timed here with ``perf_counter`` (libp2p's own
helper rounds to whole milliseconds, which is 0 on a LAN): every
``rtt_interval_s`` for a new peer, backing off by doubling to
``rtt_max_interval_s`` while its RTT stays within :data:`_RTT_STABLE` of
the smoothed value, back to the short interval when it moves or a probe
fails. A probe that succeeds counts as hearing from the peer, and so does a
probe the peer sends us: a pair of nodes whose probes alternate need no
liveness probe at all.

This node answers pings itself (:meth:`Membership.answer_pings`, the same
``/ipfs/ping/1.0.0`` echo) instead of py-libp2p's handler, which closes a
stream idle for 10 s: with probes 20-30 s apart every probe had to open a
new stream (multistream-select, yamux open and close), about a third of an
idle node's probing cost (issue 14). Ours keeps a stream for
:data:`_PING_ANSWER_IDLE_FACTOR` times the longest probe interval. A probe
on a kept stream that the other side closed (a responder with libp2p's
10 s rule) is retried at once on a new stream.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
import logging
import secrets
import time
from typing import Any

import multiaddr
import trio

from libp2p.abc import IHost, INetConn, INetStream, INetwork, INotifee
from libp2p.host.ping import ID as PING_PROTOCOL
from libp2p.io.exceptions import IncompleteReadError
from libp2p.io.utils import read_exactly
from libp2p.network.stream.exceptions import StreamEOF
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo

from ..core.router import Router
from .config import NodeConfig
from .counters import NodeCounters
from .framing import finish_stream
from .wakeup import Wakeup

__all__ = ["Membership", "expire_check_s", "split_p2p_addr"]

log = logging.getLogger(__name__)

_TICK_S = 0.25
"""Most a connection change waits to be acted on; the loops wake on libp2p's
connection events and sleep up to :data:`_IDLE_CHECK_S` otherwise."""
_IDLE_CHECK_S = 5.0
_MAX_BACKOFF_S = 30.0
_FORGET_AFTER_FAILURES = 6
_PING_BYTES = 32
_PEERSTORE_TTL_S = 600
_PING_ANSWER_IDLE_FACTOR = 3.0
"""Our ping responder closes a stream idle for this many ``rtt_max_interval_s``
(py-libp2p's closes one idle for 10 s, ``libp2p.host.ping.RESP_TIMEOUT``)."""
_PING_STREAMS_PER_PEER = 2
"""Inbound ping streams answered per peer at once (the ping spec's limit)."""
_REPULL_MAX_S = 120.0
"""Longest wait between two pulls of a connected peer that is not in the view (or has no digest in it)."""
_RTT_STABLE = (1.0, 10.0)
"""A sample within 100 % or 10 ms of the smoothed RTT counts as stable: what
routing weighs against prefill (milliseconds per token) barely moves with
less, and a loaded machine's loopback jitters more than that."""


def next_probe_interval(interval: float, rtt_ms: float | None, smoothed_ms: float | None, short: float, longest: float) -> float:
    """The wait before a peer's next RTT probe: twice as long after a stable
    sample (up to ``longest``), half as long after one off the smoothed RTT
    or a failed probe (down to ``short``). Halving, not restarting at
    ``short``: a loaded machine's jitter kept every peer at the shortest
    interval, N/2 probes per second per node at 16 idle nodes (issue 14);
    the deviating sample itself already moves the smoothed RTT."""
    rel, absolute = _RTT_STABLE
    if rtt_ms is not None and smoothed_ms is not None and abs(rtt_ms - smoothed_ms) <= max(absolute, rel * smoothed_ms):
        return min(longest, 2 * interval)
    return max(short, interval / 2)


def expire_check_s(ttl_s: float) -> float:
    """How often the view is checked for silent peers: one leaves it at most this long after its TTL."""
    return min(1.0, ttl_s / 4)


def split_p2p_addr(addr: str) -> tuple[str, str]:
    """``/ip4/../tcp/../p2p/<id>`` -> (transport part, peer id); raises ValueError."""
    ma = multiaddr.Multiaddr(addr)
    peer = ma.value_for_protocol("p2p")
    if not peer:
        raise ValueError(f"{addr!r} has no /p2p/<peer id>")
    ID.from_base58(peer)  # validates
    transport = addr.split("/p2p/")[0]
    return transport, peer


class _ConnectionEvents(INotifee):
    """libp2p network events -> wake the membership loops (no polling)."""

    def __init__(self, wakeups: list[Wakeup]) -> None:
        self._wakeups = wakeups

    def _wake(self) -> None:
        for w in self._wakeups:
            w.set()

    async def opened_stream(self, network: INetwork, stream: INetStream) -> None:
        pass

    async def closed_stream(self, network: INetwork, stream: INetStream) -> None:
        pass

    async def connected(self, network: INetwork, conn: INetConn) -> None:
        self._wake()

    async def disconnected(self, network: INetwork, conn: INetConn) -> None:
        self._wake()

    async def listen(self, network: INetwork, multiaddr: Any) -> None:
        pass

    async def listen_close(self, network: INetwork, multiaddr: Any) -> None:
        pass


@dataclass
class _Probe:
    interval: float
    due: float
    tried: float = float("-inf")
    """When the last probe started (a liveness probe goes out once per silence)."""


@dataclass
class _Entry:
    peer_id: str
    addrs: tuple[str, ...]
    """Direct transport addresses (no ``/p2p/``)."""
    bootstrap: bool = False
    relay_addrs: tuple[str, ...] = ()
    """``.../p2p/<relay>/p2p-circuit`` addresses from its latest load report."""
    reachability: str = "unknown"
    relay_service: bool = False
    failures: int = 0
    next_dial: float = 0.0
    dialing: bool = False


class Membership:
    def __init__(
        self,
        *,
        host: IHost,
        router: Router,
        config: NodeConfig,
        counters: NodeCounters,
        self_id: str,
        on_meet: Callable[[str], None],
        on_gone: Callable[[str], Awaitable[None]],
        on_disconnected: Callable[[str], None] | None = None,
        connect: Callable[[str, bool], Awaitable[None]] | None = None,
        relayed_peers: Callable[[], int] = lambda: 0,
        path_of_stream: Callable[[str, INetStream], str | None] | None = None,
        best_path: Callable[[str], str | None] | None = None,
    ) -> None:
        self.host = host
        self.router = router
        self.config = config
        self.counters = counters
        self.self_id = self_id
        self._on_meet = on_meet
        self._on_gone = on_gone
        self._on_disconnected = on_disconnected
        """Called for every peer whose last connection closed, in our model's view or not."""
        self._connect = connect
        """Direct dial, then through the peer's relays when allowed (:class:`.paths.Connector`)."""
        self._relayed_peers = relayed_peers
        self._path_of_stream = path_of_stream
        self._best_path = best_path
        self.rtt_paths: dict[str, str | None] = {}
        """The path each peer's last RTT sample was measured on."""
        self._book: dict[str, _Entry] = {}
        self._connected: set[str] = set()
        self._ping_streams: dict[str, INetStream] = {}
        self._ping_answering: dict[str, int] = {}
        """Inbound ping streams being answered, per prober."""
        self._probes: dict[str, _Probe] = {}
        self._repull: dict[str, tuple[float, float]] = {}
        """Connected peers not in the view, or without their digest in it: (next pull, wait after it)."""
        self._connections_changed_at = time.monotonic()
        """When a connection last opened or closed (keep-alives announce a change to the swarm)."""
        self._connections_changed = Wakeup()
        self._dial_wanted = Wakeup()
        self._trio_token: trio.lowlevel.TrioToken | None = None
        for addr in config.bootstrap:
            transport, peer = split_p2p_addr(addr)
            if peer != self_id:
                entry = self._book.setdefault(peer, _Entry(peer, (), bootstrap=True))
                entry.addrs = tuple(dict.fromkeys((*entry.addrs, transport)))
                self._to_peerstore(peer, [transport])

    # -- learning addresses --------------------------------------------------------------
    def learn(self, peer_id: str, addrs: tuple[str, ...]) -> None:
        """Remember where ``peer_id`` can be dialled (gossip, pulls, mDNS)."""
        if peer_id == self.self_id:
            return
        clean = []
        for addr in addrs:
            if "/p2p-circuit" in addr:
                continue  # only load reports carry circuit addresses (learn_load)
            transport = addr.split("/p2p/")[0]
            if transport and len(clean) < 8:
                clean.append(transport)
        entry = self._book.get(peer_id)
        if entry is None:
            if not clean or len(self._book) >= 4 * self.config.max_peers:
                return
            entry = self._book[peer_id] = _Entry(peer_id, tuple(clean))
        elif clean:
            entry.addrs = tuple(dict.fromkeys((*clean, *entry.addrs)))[:8]
        if entry.failures and peer_id in self.router.view and entry.reachability != "private":
            entry.failures = 0  # heard again: dial it again soon
            entry.next_dial = 0.0
        # A peer behind NAT is heard all the time and still cannot be dialled
        # directly: it keeps its backoff (its relays are tried on each dial).
        if clean:
            self._to_peerstore(peer_id, clean)
        if peer_id not in self._connected:
            self._dial_wanted.set()

    def learn_load(self, peer_id: str, reachability: str, relay_addrs: tuple[str, ...], relay_service: bool) -> None:
        """What a load report says about reaching the peer (its latest report wins)."""
        if peer_id == self.self_id:
            return
        entry = self._book.get(peer_id)
        if entry is None:
            if not relay_addrs or len(self._book) >= 4 * self.config.max_peers:
                return
            entry = self._book[peer_id] = _Entry(peer_id, ())
        entry.reachability = reachability
        entry.relay_service = relay_service
        circuits = tuple(a for a in relay_addrs if a.endswith("/p2p-circuit"))[:4]
        if circuits != entry.relay_addrs:
            entry.relay_addrs = circuits
            if circuits and entry.failures:
                entry.failures = 0  # new relays: worth a dial now
                entry.next_dial = 0.0
            if circuits and peer_id not in self._connected:
                self._dial_wanted.set()

    def addrs_of(self, peer_id: str) -> tuple[list[str], list[str]]:
        """(direct addresses, circuit addresses) of a peer, for :class:`.paths.Connector`."""
        entry = self._book.get(peer_id)
        if entry is None:
            return [], []
        return list(entry.addrs), list(entry.relay_addrs)

    def reachability_of(self, peer_id: str) -> str:
        entry = self._book.get(peer_id)
        return entry.reachability if entry is not None else "unknown"

    def relays(self) -> list[str]:
        """Peers that say they offer a relay service, those with the shortest RTT first."""
        out = [e.peer_id for e in self._book.values() if e.relay_service]

        def rtt(peer: str) -> float:
            state = self.router.view.get(peer)
            return state.rtt_ms if state is not None and state.rtt_ms is not None else 1e9

        return sorted(out, key=rtt)

    def _to_peerstore(self, peer_id: str, addrs: list[str]) -> None:
        """So that a forward or pull can dial a peer the dial loop has not reached yet."""
        try:
            parsed = [multiaddr.Multiaddr(a) for a in addrs]
            self.host.get_peerstore().add_addrs(ID.from_base58(peer_id), parsed, _PEERSTORE_TTL_S)
        except Exception as exc:  # a bad address from gossip must not break anything
            log.debug("addresses of %s not usable: %s", peer_id, exc)

    def known_peers(self, limit: int) -> list[tuple[str, list[str]]]:
        """Peers in the view with their addresses (for peer exchange)."""
        out = []
        for state in self.router.view:
            entry = self._book.get(state.peer_id)
            if entry is not None and entry.addrs:
                out.append((state.peer_id, list(entry.addrs)))
                if len(out) >= limit:
                    break
        return out

    def connected(self) -> set[str]:
        return set(self._connected)

    def keepalive_wanted(self, now: float | None = None) -> bool:
        """Whether our idle load reports should keep going out every ``keepalive_interval_s``:
        while some peer in the view is not directly connected to us (it hears
        of us through gossip alone), and for two keep-alive intervals after
        any of our connections opened or closed (the swarm's other nodes, which
        we may not know, learn our addresses from them and dial us: discovery).
        A directly connected peer sees our connection, pulls our digest when
        it opens and probes us when we are silent, so it needs no keep-alive."""
        now = time.monotonic() if now is None else now
        if now - self._connections_changed_at < 2 * self.router.config.gossip.keepalive_interval_s:
            return True
        connected = self._connected
        return any(state.peer_id not in connected for state in self.router.view)

    # -- running -------------------------------------------------------------------------------
    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        self._trio_token = trio.lowlevel.current_trio_token()
        self._connections_changed.bind()
        self._dial_wanted.bind()
        events = _ConnectionEvents([self._connections_changed, self._dial_wanted])
        self.host.get_network().register_notifee(events)
        self.host.set_stream_handler(PING_PROTOCOL, self.answer_pings)
        unregister = self._hook_mdns()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._dial_loop, nursery)
                nursery.start_soon(self._watch_loop)
                nursery.start_soon(self._expire_loop)
                nursery.start_soon(self._rtt_loop)
                task_status.started()
        finally:
            unregister()
            remove = getattr(self.host.get_network(), "remove_notifee", None)
            if remove is not None:
                remove(events)

    async def aclose(self) -> None:
        for peer_id in list(self._ping_streams):
            await finish_stream(self._ping_streams.pop(peer_id), True)

    def _hook_mdns(self) -> Callable[[], None]:
        if not self.config.mdns:
            return lambda: None
        from libp2p.discovery.events.peerDiscovery import peerDiscovery

        token = self._trio_token

        def discovered(info: PeerInfo) -> None:
            # zeroconf calls this from its own thread.
            addrs = tuple(str(a) for a in info.addrs)
            assert token is not None
            try:
                token.run_sync_soon(self.learn, info.peer_id.to_base58(), addrs)
            except trio.RunFinishedError:
                pass

        peerDiscovery.register_peer_discovered_handler(discovered)
        return lambda: peerDiscovery.unregister_peer_discovered_handler(discovered)

    async def _dial_loop(self, nursery: trio.Nursery) -> None:
        """Dials what the book holds and we are not connected to: when a peer is
        learned or a connection changes, when a back-off ends, and every
        :data:`_IDLE_CHECK_S` in any case."""
        limiter = trio.CapacityLimiter(8)
        while True:
            now = time.monotonic()
            live = {p.to_base58() for p in self.host.get_connected_peers()}
            room = self.config.max_peers - len(live)
            soonest = now + _IDLE_CHECK_S
            for entry in list(self._book.values()):
                if entry.peer_id in live or entry.dialing:
                    continue
                if not entry.addrs and not (entry.relay_addrs and self._connect is not None):
                    continue
                if now < entry.next_dial:
                    soonest = min(soonest, entry.next_dial)
                    continue
                if room <= 0:
                    break
                entry.dialing = True
                room -= 1
                nursery.start_soon(self._dial, entry, limiter)
            await trio.sleep(_TICK_S)  # at most this often, as before
            await self._dial_wanted.wait(soonest - time.monotonic())

    async def _dial(self, entry: _Entry, limiter: trio.CapacityLimiter) -> None:
        try:
            async with limiter:
                if self._connect is not None:
                    # One relayed connection per pair: the peer with the smaller id opens it
                    # (a forward the other way opens one on demand).
                    allow_relay = (
                        self.self_id < entry.peer_id and self._relayed_peers() < self.config.nat.max_relayed_peers
                    )
                    with trio.fail_after(self.config.connect_timeout_s * (1 + len(entry.relay_addrs))):
                        await self._connect(entry.peer_id, allow_relay)
                else:
                    info = PeerInfo(ID.from_base58(entry.peer_id), [multiaddr.Multiaddr(a) for a in entry.addrs])
                    with trio.fail_after(self.config.connect_timeout_s):
                        await self.host.connect(info)
            entry.failures = 0
            self.counters.dials_ok += 1
        except Exception as exc:  # unreachable, refused, handshake failed, timed out
            entry.failures += 1
            self.counters.dials_failed += 1
            entry.next_dial = time.monotonic() + min(_MAX_BACKOFF_S, 0.5 * 2**entry.failures)
            log.debug("dial %s failed (%d): %s: %s", entry.peer_id, entry.failures, type(exc).__name__, exc)
            if not entry.bootstrap and entry.failures >= _FORGET_AFTER_FAILURES and entry.peer_id not in self.router.view:
                self._book.pop(entry.peer_id, None)
        finally:
            entry.dialing = False
            if entry.failures:
                self._dial_wanted.set()  # its back-off is due before the next idle check

    async def _watch_loop(self) -> None:
        """Notice new connections (ours or theirs): pull the newcomer's digest;
        and closed ones: the peer leaves the view. Woken by libp2p's connection
        events (and every :data:`_IDLE_CHECK_S`), at most every :data:`_TICK_S`."""
        while True:
            live = {p.to_base58() for p in self.host.get_connected_peers()}
            for peer_id in live - self._connected:
                self._on_meet(peer_id)
            lost = self._connected - live
            if live != self._connected:
                self._connections_changed_at = time.monotonic()
            self._connected = live
            for peer_id in lost:
                if self._on_disconnected is not None:
                    self._on_disconnected(peer_id)
                self._probes.pop(peer_id, None)
                stream = self._ping_streams.pop(peer_id, None)
                if stream is not None:
                    await finish_stream(stream, False)
                if peer_id in self.router.view:
                    self.router.on_peer_gone(peer_id)
                    self.counters.peers_disconnected += 1
                    log.info("peer %s left the view (connection closed)", peer_id)
                    await self._on_gone(peer_id)
            await trio.sleep(_TICK_S)
            await self._connections_changed.wait(_IDLE_CHECK_S)

    async def _expire_loop(self) -> None:
        ttl = self.router.config.gossip.peer_ttl_s
        while True:
            await trio.sleep(expire_check_s(ttl))
            self._repull_unviewed(time.monotonic())
            for peer_id in self.router.view.expire(time.monotonic(), ttl):
                self.counters.peers_expired += 1
                log.info("peer %s left the view (silent for %.1f s)", peer_id, ttl)
                self._probes.pop(peer_id, None)
                stream = self._ping_streams.pop(peer_id, None)
                if stream is not None:
                    await finish_stream(stream, False)
                await self._on_gone(peer_id)

    def _has_digest(self, peer_id: str) -> bool:
        state = self.router.view.get(peer_id)
        return state is not None and bool(state.fingerprint) and state.digest_at is not None

    def _repull_unviewed(self, now: float) -> None:
        """A connected peer that is not in the view, or is in it without its digest
        (its first pull failed: only a load report or a probe put it there; or it
        expired while its connection stayed open, a hung process that came back),
        is pulled again: it may send no keep-alive whose digest version would
        make us pull it."""
        gossip = self.router.config.gossip
        for peer_id in [p for p in self._repull if p not in self._connected or self._has_digest(p)]:
            del self._repull[peer_id]
        for peer_id in self._connected:
            if self._has_digest(peer_id):
                continue
            entry = self._repull.get(peer_id)
            if entry is None:
                self._repull[peer_id] = (now + gossip.keepalive_interval_s, gossip.keepalive_interval_s)
            elif now >= entry[0]:
                wait = min(_REPULL_MAX_S, 2 * entry[1])
                self._repull[peer_id] = (now + wait, wait)
                self._on_meet(peer_id)

    def _probe_due(self, state: Any, probe: _Probe) -> float:
        """The RTT schedule's next probe, or a liveness probe once the peer has been
        silent for ``peer_ttl_s - keepalive_interval_s`` (one per silence)."""
        gossip = self.router.config.gossip
        silent_at = state.last_seen + gossip.peer_ttl_s - gossip.keepalive_interval_s
        return probe.due if probe.tried >= silent_at else min(probe.due, silent_at)

    async def _rtt_loop(self) -> None:
        short = self.config.rtt_interval_s
        gossip = self.router.config.gossip
        # Wakes at least this often, so that a peer new to the view gets its
        # liveness probe in time even when the RTT schedule is slower than the TTL.
        longest_sleep = min(short, gossip.peer_ttl_s - gossip.keepalive_interval_s)
        while True:
            now = time.monotonic()
            due = []
            soonest = now + short
            for state in self.router.view:
                if state.peer_id not in self._connected:
                    continue
                probe = self._probes.get(state.peer_id)
                if probe is None:
                    probe = self._probes[state.peer_id] = _Probe(short, now + short)
                at = self._probe_due(state, probe)
                if at <= now:
                    probe.tried = now
                    due.append(state.peer_id)
                else:
                    soonest = min(soonest, at)
            if due:
                async with trio.open_nursery() as nursery:
                    for peer_id in due:
                        nursery.start_soon(self._ping, peer_id)
                continue  # their next probes are scheduled now
            for peer_id in [p for p in self._probes if p not in self._connected]:
                del self._probes[peer_id]
            await trio.sleep(min(longest_sleep, max(0.05, soonest - time.monotonic())))

    def _probed(self, peer_id: str, rtt_ms: float | None) -> None:
        """Next probe of ``peer_id``: later while its RTT is stable, soon otherwise."""
        probe = self._probes.get(peer_id)
        if probe is None:
            return
        state = self.router.view.get(peer_id)
        smoothed = None if state is None else state.rtt_ms
        probe.interval = next_probe_interval(probe.interval, rtt_ms, smoothed, self.config.rtt_interval_s, self.config.rtt_max_interval_s)
        probe.due = time.monotonic() + probe.interval

    async def _ping(self, peer_id: str) -> None:
        rtt_ms: float | None = None
        try:
            rtt_ms = await self._measure_rtt(peer_id)
        finally:
            self._probed(peer_id, rtt_ms)
            if rtt_ms is not None and peer_id in self.router.view:
                self.router.view.set_rtt(peer_id, rtt_ms, time.monotonic())

    async def _measure_rtt(self, peer_id: str) -> float | None:
        if peer_id in self._ping_streams:
            rtt_ms = await self._probe_once(peer_id)
            if rtt_ms is not None or peer_id not in self._connected:
                return rtt_ms
            # The kept stream failed (the responder closed it, or it broke): once more on a new one.
        return await self._probe_once(peer_id)

    async def _probe_once(self, peer_id: str) -> float | None:
        stream = self._ping_streams.get(peer_id)
        if stream is not None and self._path_of_stream is not None and self._best_path is not None:
            if self._path_of_stream(peer_id, stream) != self._best_path(peer_id):
                # A better connection came up (a hole punch): measure on it.
                self._ping_streams.pop(peer_id, None)
                await finish_stream(stream, True)
                stream = None
        try:
            with trio.fail_after(self._ping_timeout_s):
                if stream is None:
                    stream = await self.host.new_stream(ID.from_base58(peer_id), [PING_PROTOCOL])
                    self._ping_streams[peer_id] = stream
                payload = secrets.token_bytes(_PING_BYTES)
                self.counters.rtt_probes += 1
                t0 = time.perf_counter()
                await stream.write(payload)
                echo = await read_exactly(stream, _PING_BYTES)
                rtt_ms = (time.perf_counter() - t0) * 1000
            if echo != payload:
                raise ValueError("ping echo differs")
            if peer_id in self.router.view:
                path = self._path_of_stream(peer_id, stream) if self._path_of_stream is not None else None
                if path != self.rtt_paths.get(peer_id, path):
                    self.router.view.reset_rtt(peer_id)  # the old path's figure says nothing now
                self.rtt_paths[peer_id] = path
            return rtt_ms
        except Exception as exc:
            log.debug("ping %s failed: %s: %s", peer_id, type(exc).__name__, exc)
            if self._ping_streams.pop(peer_id, None) is not None and stream is not None:
                await finish_stream(stream, False)
            return None

    @property
    def _ping_timeout_s(self) -> float:
        """Longest one ping exchange may take, either side (opening its stream included)."""
        return min(5.0, self.config.connect_timeout_s)

    async def answer_pings(self, stream: INetStream) -> None:
        """The ``/ipfs/ping/1.0.0`` responder: echo each 32-byte ping until the
        prober closes the stream or leaves it idle for
        :data:`_PING_ANSWER_IDLE_FACTOR` x ``rtt_max_interval_s``; each ping
        counts as hearing from the prober if it is in the view."""
        peer_id = stream.muxed_conn.peer_id.to_base58()
        open_streams = self._ping_answering.get(peer_id, 0)
        if open_streams >= _PING_STREAMS_PER_PEER:
            await stream.reset()
            return
        self._ping_answering[peer_id] = open_streams + 1
        idle_s = _PING_ANSWER_IDLE_FACTOR * self.config.rtt_max_interval_s
        clean = True
        try:
            while True:
                with trio.move_on_after(idle_s) as idle:
                    try:
                        payload = await read_exactly(stream, _PING_BYTES)
                    except (StreamEOF, IncompleteReadError):
                        break  # the prober closed it
                if idle.cancelled_caught:
                    break
                if peer_id in self.router.view:
                    self.router.view.add(peer_id, time.monotonic())
                with trio.fail_after(self._ping_timeout_s):
                    await stream.write(payload)
        except Exception as exc:  # reset, timed out writing, connection gone
            log.debug("answering pings of %s: %s: %s", peer_id, type(exc).__name__, exc)
            clean = False
        finally:
            left = self._ping_answering.get(peer_id, 1) - 1
            if left > 0:
                self._ping_answering[peer_id] = left
            else:
                self._ping_answering.pop(peer_id, None)
            await finish_stream(stream, clean)
