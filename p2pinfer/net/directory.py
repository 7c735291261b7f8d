"""``/p2pinfer/directory/1.0.0``: the prefix directory on a live node.

The directory's rules are the core's (:mod:`p2pinfer.core.directory`, the
same objects the simulator runs): an :class:`AnchorTracker` follows this
node's engine cache, a :class:`DirectoryStore` holds the anchors this node
owns, queries are built by :func:`make_query` and answered by
:meth:`DirectoryStore.answer`. This module only moves their messages:

* one stream per message: the sender writes one frame (a ``Register`` or a
  ``Query``, CBOR, at most :data:`MAX_DIRECTORY_BYTES`), the directory node
  answers with one frame (a ``Resend``, empty when every check matched; an
  ``Answer``; or a ``Refusal`` saying why nothing was applied) and both
  close the stream;
* a register must name the stream's own (Noise-authenticated) peer as its
  holder (``NOT_HOLDER`` otherwise): nobody registers blocks for another;
* **placement** (:class:`DhtPlacement`): the owners of an anchor are the
  ``replicas`` peers closest to :func:`anchor_key` in py-libp2p's KadDHT
  keyspace, among this node and the peers of its KadDHT routing table that
  speak this protocol (:class:`KademliaPlacement`, the same metric as the
  DHT's lookups). No membership list is gossiped for it: the routing table
  is filled by the DHT itself (its lookups and the peers that query it)
  and by this node's connections;
* holders send their anchors' changes every ``update_interval_s``, a
  checksum refresh every ``refresh_s`` (the owner answers ``Resend`` for
  the anchors that do not match, the holder sends those in full), and
  every anchor whose owners changed (a peer joined or left) in full to its
  new owners; owners drop anchors they no longer own and records not
  refreshed for ``entry_ttl_s``.

Every task runs in the node's nursery (:meth:`DirectoryService.run`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
import logging
import random
import threading
import time
from typing import Any

import trio

from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from ..core.directory import (
    MAX_DIRECTORY_BYTES,
    anchor_key,
    AnchorCheck,
    AnchorTracker,
    AnchorUpdate,
    Answer,
    askable_owners,
    DirectoryLimit,
    DirectoryConfig,
    DirectoryError,
    DirectoryStore,
    KademliaPlacement,
    Query,
    Refusal,
    Register,
    Resend,
    anchor_of,
    decode_message,
    encode_message,
    make_query,
)
from ..core.dht import RESOLVE_TTL_S, ResolveSchedule, routing_table_complete
from ..core.peers import Load
from ..core.radix import TreeEvent
from ..core.router import Router
from .framing import FrameError, FrameReader, FrameTooLarge, finish_stream, write_frame

__all__ = ["DIRECTORY_PROTOCOL", "DhtPlacement", "DirectoryService", "DirectoryRefused"]

DIRECTORY_PROTOCOL = TProtocol("/p2pinfer/directory/1.0.0")
log = logging.getLogger(__name__)

_PLACEMENT_TICK_S = 0.5
"""How often the placement is brought in line with the DHT's routing table."""


class DirectoryRefused(Exception):
    """A directory node answered with a :class:`Refusal`."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(f"{refusal.code}: {refusal.message}")
        self.refusal = refusal


class DhtPlacement:
    """Owners of anchors from py-libp2p's KadDHT.

    Members are this node, the routing table's peers, and the peers that DHT
    lookups of anchors found (:meth:`resolve`), less those that identify
    says do not speak :data:`DIRECTORY_PROTOCOL` (KadDHT runs only on nodes
    that do, and its routing tables only admit KadDHT servers). Connected
    peers are offered to the routing table (the DHT keeps what its buckets
    admit); a peer whose connection closed, or that could not be reached,
    is taken out at once (:meth:`forget`): py-libp2p only drops peers that
    fail one of its own queries or go stale for an hour, and a dead owner
    must lose its anchors now.

    While no bucket of the routing table is full, the table holds every
    DHT peer this node has heard of, and the closest of them are the
    anchor's owners everywhere; once one is full (more than 20 peers in
    one half of the keyspace, about 40 nodes and more), the table is a
    sample, and each anchor is looked up in the DHT
    (``find_closest_peers_network``) before it is first used, and again
    after :data:`RESOLVE_TTL_S`.
    """

    def __init__(self, host: IHost, dht: Any, self_id: str, replicas: int) -> None:
        self.host = host
        self.dht = dht
        self.self_id = self_id
        self.replicas = replicas
        self.placement = KademliaPlacement([self_id], replicas)
        self._was_connected: set[str] = set()
        self._learned: set[str] = set()
        """Peers DHT lookups named among an anchor's closest (maybe not in the routing table)."""
        self._resolve = ResolveSchedule(RESOLVE_TTL_S)
        self.lookups = 0
        """DHT lookups made (``find_closest_peers_network``)."""

    def owners(self, anchor: int) -> list[str]:
        return self.placement.owners(anchor)

    def members(self) -> list[str]:
        return self.placement.members()

    def _protocols(self, peer: ID) -> list[str] | None:
        """What identify learned the peer speaks; ``None`` before identify ran."""
        try:
            protocols = self.host.get_peerstore().get_protocols(peer)
        except Exception:
            return None
        return list(protocols) if protocols else None

    def _speaks_directory(self, peer: ID) -> bool:
        protocols = self._protocols(peer)
        return protocols is not None and str(DIRECTORY_PROTOCOL) in protocols

    def _not_directory(self, peer: ID) -> bool:
        protocols = self._protocols(peer)
        return protocols is not None and str(DIRECTORY_PROTOCOL) not in protocols

    def lacks_directory(self, peer: str) -> bool:
        """Identify says ``peer`` does not speak the directory protocol (a gossip-mode node)."""
        try:
            return self._not_directory(ID.from_base58(peer))
        except Exception:  # not a peer id
            return False

    def table_complete(self) -> bool:
        """No bucket full: the routing table holds every DHT peer heard of."""
        buckets = self.dht.routing_table.buckets
        return routing_table_complete((b.size() for b in buckets), buckets[0].bucket_size if buckets else 20)

    async def resolve(self, anchors: Iterable[int], now: float) -> list[int]:
        """Look up in the DHT the anchors not looked up for :data:`RESOLVE_TTL_S`
        (only while the routing table is incomplete); the closest peers found
        join the members. Returns the anchors whose owners changed."""
        todo = self._resolve.due(anchors, now, self.table_complete())
        if not todo:
            return []
        found: set[str] = set()

        async def one(anchor: int) -> None:
            self.lookups += 1
            try:
                peers = await self.dht.peer_routing.find_closest_peers_network(anchor_key(anchor))
            except Exception as exc:  # the DHT's own errors: keep the owners we have
                log.debug("DHT lookup of anchor %x failed: %s", anchor, exc)
                return
            found.update(p.to_base58() for p in peers[: self.replicas + 1] if not self._not_directory(p))

        async with trio.open_nursery() as nursery:
            for anchor in todo:
                nursery.start_soon(one, anchor)
        new = found - set(self.placement.members())
        self._learned |= new
        changed: set[int] = set()
        for peer in sorted(new):
            changed.update(self.placement.add(peer))
        return sorted(changed)

    def forget(self, peer: str) -> list[int]:
        """``peer`` could not be reached: out of the routing table and the
        placement until it is connected again. Returns the anchors that moved."""
        self._learned.discard(peer)
        if peer == self.self_id:
            return []
        self.dht.routing_table.remove_peer(ID.from_base58(peer))
        return self.placement.remove(peer)

    async def sync(self) -> list[int]:
        """Bring the members in line with the DHT; returns the anchors whose owners changed."""
        table = self.dht.routing_table
        connected = {p.to_base58(): p for p in self.host.get_connected_peers()}
        for name, peer in connected.items():
            if not table.peer_in_table(peer) and self._speaks_directory(peer):
                await self.dht.add_peer(peer)
        for name in self._was_connected - set(connected):
            table.remove_peer(ID.from_base58(name))
        self._was_connected = set(connected)
        members = {self.self_id} | self._learned
        for peer in table.get_peer_ids():
            if not self._not_directory(peer):
                members.add(peer.to_base58())
        changed: set[int] = set()
        for gone in set(self.placement.members()) - members:
            changed.update(self.placement.remove(gone))
        for new in sorted(members - set(self.placement.members())):
            changed.update(self.placement.add(new))
        return sorted(changed)


class DirectoryService:
    """One node's part of the directory: holder, owner and entry (see the module docstring)."""

    def __init__(
        self,
        *,
        host: IHost,
        router: Router,
        placement: DhtPlacement,
        config: DirectoryConfig,
        load: Callable[[], Load],
        timeout_s: float,
        registering: Callable[[], bool] = lambda: True,
        distrusted: Callable[[str], bool] = lambda peer: False,
    ) -> None:
        self.host = host
        self.router = router
        self.placement = placement
        self.config = config
        self.self_id = placement.self_id
        self._load = load
        self._timeout_s = timeout_s
        self._registering = registering
        self._distrusted = distrusted
        """Peers this node sanctioned (:class:`~p2pinfer.net.sanctions.PeerSanctions`): not asked."""
        self.store = DirectoryStore(router.hasher.block_size, max_blocks_per_holder=config.max_blocks_per_holder,
                                    max_holders=config.max_holders)
        self.tracker = AnchorTracker(router.hasher, config.anchor_blocks)
        self._lock = threading.Lock()
        """Cache events may come from an engine thread; the tracker is read on trio's."""
        for seq in router.cache.sequences():
            self.tracker.on_event_insert(seq)
        router.cache.subscribe(self._on_cache_event)
        self.sent: Counter[str] = Counter()
        """Messages sent, by kind (register, refresh, resync, query)."""
        self.bytes_sent = 0
        self.bytes_received = 0
        """Directory frames this node read (requests served and replies), bytes."""
        self.received: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        """Messages that got no reply (a dead or unreachable owner), by kind."""
        self.refused: Counter[str] = Counter()
        """Refusals sent, by code."""
        self.lookups = 0
        self.answers = 0
        self.blind = 0
        """Lookups that ended without an answer (every attempt failed or timed out)."""
        self.skipped_distrusted = 0
        """Lookups with no owner to ask: every owner of the anchor is distrusted here."""
        self._nursery: trio.Nursery | None = None

    def _on_cache_event(self, event: TreeEvent) -> None:
        with self._lock:
            self.tracker.on_event(event)

    # -- the directory side ------------------------------------------------------------
    async def handle(self, stream: INetStream) -> None:
        peer = stream.muxed_conn.peer_id.to_base58()
        ok = False
        try:
            with trio.fail_after(self._timeout_s):
                try:
                    data = await FrameReader(stream).read_frame(MAX_DIRECTORY_BYTES)
                except FrameTooLarge as exc:
                    await self._refuse(stream, "TOO_LARGE", str(exc))
                    ok = True
                    return
                if data is None:
                    return
                self.bytes_received += len(data)
                reply = self.on_message(peer, data, time.monotonic())
                await write_frame(stream, encode_message(reply))
                ok = True
        except (FrameError, trio.TooSlowError) as exc:
            log.debug("directory stream from %s failed: %s", peer, exc)
        finally:
            await finish_stream(stream, ok)

    def on_message(self, peer: str, data: bytes, now: float) -> Resend | Answer | Refusal:
        """One request frame from ``peer``, decoded strictly, and the reply to send."""
        try:
            msg = decode_message(data)
        except DirectoryError as exc:
            self.refused["BAD_REQUEST"] += 1
            return Refusal("BAD_REQUEST", str(exc))
        if isinstance(msg, Register):
            if msg.holder != peer:
                self.refused["NOT_HOLDER"] += 1
                return Refusal("NOT_HOLDER", f"a register from {peer} names holder {msg.holder}")
            self.received["register"] += 1
            try:
                return Resend(tuple(self.store.apply(msg, now)))
            except DirectoryLimit as exc:
                self.refused["LIMIT"] += 1
                return Refusal("LIMIT", str(exc))
        if isinstance(msg, Query):
            self.received["query"] += 1
            return self.store.answer(msg, now, exclude=peer)
        self.refused["BAD_REQUEST"] += 1
        return Refusal("BAD_REQUEST", f"a directory node answers registers and queries, not a {type(msg).__name__}")

    async def _refuse(self, stream: INetStream, code: str, message: str) -> None:
        self.refused[code] += 1
        await write_frame(stream, encode_message(Refusal(code, message)))

    # -- talking to a directory node -----------------------------------------------------
    async def _exchange(self, owner: str, msg: Register | Query) -> Resend | Answer:
        """Send one message, read its reply; raises on a refusal, a timeout or a lost peer."""
        data = encode_message(msg)
        stream: INetStream | None = None
        ok = False
        try:
            stream = await self.host.new_stream(ID.from_base58(owner), [DIRECTORY_PROTOCOL])
            await write_frame(stream, data)
            self.bytes_sent += len(data)
            raw = await FrameReader(stream).read_frame(MAX_DIRECTORY_BYTES)
            if raw is None:
                raise FrameError("the directory node closed the stream without a reply")
            self.bytes_received += len(raw)
            ok = True
        finally:
            if stream is not None:
                await finish_stream(stream, ok)
        reply = decode_message(raw)
        if isinstance(reply, Refusal):
            raise DirectoryRefused(reply)
        expected = Resend if isinstance(msg, Register) else Answer
        if not isinstance(reply, expected):
            raise DirectoryError(f"a {type(msg).__name__} was answered with a {type(reply).__name__}")
        return reply

    # -- the holder side ---------------------------------------------------------------
    async def send_updates(
        self, updates: Sequence[AnchorUpdate], kind: str, checks: Sequence[AnchorCheck] = (), only: str | None = None
    ) -> None:
        """One Register per owner (the same batching as the simulator's ``_send_updates``)."""
        if not updates and not checks:
            return
        if only is None:
            batch = {u.anchor for u in updates} | {c.anchor for c in checks}
            moved = await self.placement.resolve(batch, time.monotonic())
            elsewhere = set(moved) - batch
            if elsewhere and self._nursery is not None:
                self._nursery.start_soon(self.on_placement_changed, elsewhere)
        batches: dict[str, tuple[list[AnchorUpdate], list[AnchorCheck]]] = {}
        for u in updates:
            for owner in [only] if only else self.placement.owners(u.anchor):
                batches.setdefault(owner, ([], []))[0].append(u)
        for c in checks:
            for owner in self.placement.owners(c.anchor):
                batches.setdefault(owner, ([], []))[1].append(c)
        load = self._load()
        epoch = self.router.tracker.epoch
        async with trio.open_nursery() as nursery:
            for owner, (ups, cks) in batches.items():
                msg = Register(self.self_id, epoch, load, tuple(ups), tuple(cks))
                if owner == self.self_id:
                    try:
                        resend = self.store.apply(msg, time.monotonic())
                        if resend:
                            with self._lock:
                                full = self.tracker.full(resend, clear_pending=False)
                            self.store.apply(Register(self.self_id, epoch, load, tuple(full)), time.monotonic())
                    except DirectoryLimit as exc:  # our own cache is over the limit: not registered here
                        log.warning("directory: %s", exc)
                    continue
                nursery.start_soon(self._register_with, owner, msg, kind)

    async def _register_with(self, owner: str, msg: Register, kind: str) -> None:
        self.sent[kind] += 1
        try:
            with trio.fail_after(self._timeout_s):
                reply = await self._exchange(owner, msg)
        except Exception as exc:  # a dead owner, a refusal: the next refresh (or its replacement) heals it
            self.failed[kind] += 1
            log.debug("directory %s to %s failed: %s: %s", kind, owner, type(exc).__name__, exc)
            self._unreachable(owner, exc)
            return
        assert isinstance(reply, Resend)
        if reply.anchors:
            with self._lock:
                full = self.tracker.full(reply.anchors, clear_pending=False)
            await self.send_updates(full, "resync", only=owner)

    def _unreachable(self, owner: str, exc: BaseException) -> None:
        """A dial or stream that failed (not a slow answer, not a refusal): the
        owner is taken out, its anchors move, and holders re-register them."""
        if isinstance(exc, (trio.TooSlowError, DirectoryRefused, DirectoryError)):
            return
        moved = self.placement.forget(owner)
        if moved and self._nursery is not None:
            self._nursery.start_soon(self.on_placement_changed, moved)

    async def flush(self) -> None:
        """Send the pending changes now (tests; the update loop does it every ``update_interval_s``)."""
        with self._lock:
            updates = self.tracker.take_updates()
        await self.send_updates(updates, "register")

    async def refresh(self) -> None:
        """A checksum (or full) refresh of every held anchor."""
        with self._lock:
            if self.config.refresh == "checksum":
                updates, checks = self.tracker.take_updates(), self.tracker.checks()
            else:
                updates, checks = self.tracker.full(), []
        await self.send_updates(updates, "refresh", checks=checks)

    async def _update_loop(self) -> None:
        while True:
            await trio.sleep(self.config.update_interval_s)
            if self._registering():
                await self.flush()

    async def _refresh_loop(self) -> None:
        while True:
            await trio.sleep(self.config.refresh_s * random.uniform(0.9, 1.1))
            if self._registering():
                await self.refresh()

    async def _placement_loop(self) -> None:
        while True:
            changed = await self.placement.sync()
            if changed:
                await self.on_placement_changed(changed)
            await trio.sleep(_PLACEMENT_TICK_S)

    async def on_placement_changed(self, anchors: Iterable[int]) -> None:
        """Anchors moved: forget those no longer ours, re-register ours in full with their owners."""
        moved = set(anchors)
        for a in moved.intersection(self.store.anchors()):
            if self.self_id not in self.placement.owners(a):
                self.store.drop_anchor(a)
        if not self._registering():
            return
        with self._lock:
            held = moved.intersection(self.tracker.anchors())
            full = self.tracker.full(held) if held else []
        await self.send_updates(full, "register")

    async def _expire_loop(self) -> None:
        while True:
            await trio.sleep(self.config.entry_ttl_s / 2)
            self.store.expire(time.monotonic(), self.config.entry_ttl_s)

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await self.placement.sync()
            nursery.start_soon(self._placement_loop)
            nursery.start_soon(self._update_loop)
            nursery.start_soon(self._refresh_loop)
            nursery.start_soon(self._expire_loop)
            task_status.started()

    # -- the entry side ----------------------------------------------------------------
    async def lookup(self, hashes: Sequence[int], prompt_tokens: int) -> tuple[Answer, str] | None:
        """Ask an owner of the request's anchor (the next replica on a timeout)
        that this node does not distrust; the answer and the owner that gave it,
        or ``None``: no anchor (a short prompt), no owner to ask, or no answer
        within the attempts."""
        query = make_query(hashes, prompt_tokens, self.config)
        if query is None:
            return None
        with trio.move_on_after(self.config.query_timeout_s * self.config.query_attempts):
            moved = await self.placement.resolve([query.anchor], time.monotonic())
            if moved and self._nursery is not None:
                self._nursery.start_soon(self.on_placement_changed, moved)
        now = time.monotonic()
        placed = self.placement.owners(query.anchor)
        owners = askable_owners(placed, self.self_id, self._distrusted)
        if not owners:
            if placed:
                self.skipped_distrusted += 1
            return None
        self.lookups += 1
        if self.self_id in owners:
            self.answers += 1
            return self.store.answer(query, now, exclude=self.self_id), self.self_id
        start = random.randrange(len(owners))
        for attempt in range(self.config.query_attempts):
            owner = owners[(start + attempt) % len(owners)]
            self.sent["query"] += 1
            try:
                with trio.fail_after(self.config.query_timeout_s):
                    reply = await self._exchange(owner, query)
            except Exception as exc:
                self.failed["query"] += 1
                log.debug("directory query to %s failed: %s: %s", owner, type(exc).__name__, exc)
                self._unreachable(owner, exc)
                continue
            assert isinstance(reply, Answer)
            self.answers += 1
            return reply, owner
        self.blind += 1
        return None

    def anchor(self, hashes: Sequence[int]) -> int | None:
        return anchor_of(hashes, self.config.anchor_blocks)

    def status(self) -> dict[str, Any]:
        return {
            "members": len(self.placement.members()),
            "routing_table_complete": self.placement.table_complete(),
            "dht_lookups": self.placement.lookups,
            "anchors_owned": len(self.store.anchors()),
            "registrations": len(self.store),
            "anchors_held": len(self.tracker.anchors()),
            "sent": dict(self.sent),
            "failed": dict(self.failed),
            "received": dict(self.received),
            "refused": dict(self.refused),
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
            "lookups": self.lookups,
            "answers": self.answers,
            "blind": self.blind,
            "owners_distrusted": self.skipped_distrusted,
        }
