"""The simulator's prefix-directory mode (``--discovery directory``).

Holders register their anchors' blocks with each anchor's owners (batched
``Register`` messages, checksum refreshes, ``Resend`` on a mismatch); an
entry asks the owner of a request's anchor (``Query`` / ``Answer``, one
round trip, a timeout and a retry) and then decides with the answer
(``Simulator._decide``). The messages are the core's
(:mod:`p2pinfer.core.directory`), encoded and decoded as on the wire, so
their sizes are real. A mixin of :class:`~p2pinfer.sim.simulator.Simulator`:
the event loop, the nodes and the decision stay there.

With KadDHT placement (``--directory-placement kademlia``, the live node's)
the DHT's own traffic is counted too, by the rules of
:mod:`p2pinfer.core.dht` that the live placement runs: every node refreshes
its routing table every :data:`~p2pinfer.core.dht.ROUTING_TABLE_REFRESH_S`
(one lookup for its own id, one per non-empty bucket; the initial swarm at
random phases, as if it had been running, a joining node when it joins), and
while its table is incomplete (a full bucket) it looks up each anchor it
registers or queries, at first use and again after
:data:`~p2pinfer.core.dht.RESOLVE_TTL_S` (an entry's query waits for that
lookup: one round trip). A lookup is one round of FIND_NODE requests to the
``ALPHA`` members closest to its key (:func:`~p2pinfer.core.dht.lookup_queries`:
exact when every table holds every member, the floor otherwise); each answer
names ``BUCKET_SIZE`` peers with their signed records
(:func:`~p2pinfer.sim.network.find_node_response_bytes`). Each node's routing
table is taken to hold every member (py-libp2p's table keeps every DHT peer
it hears of, splitting any full bucket); the placement stays the simulator's
one membership. Not counted: the connections a lookup opens to peers it was
not connected to (Noise handshake, identify, gossipsub hello).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
import hashlib
import heapq
import random
import time

from ..core.dht import (
    BUCKET_SIZE,
    RESOLVE_TTL_S,
    ROUTING_TABLE_REFRESH_S,
    ResolveSchedule,
    kbucket_sizes,
    lookup_queries,
    refresh_lookups,
    routing_table_complete,
)
from ..core.directory import (
    AnchorCheck,
    Answer,
    askable_owners,
    AnchorTracker,
    AnchorUpdate,
    DirectoryConfig,
    DirectoryStore,
    Query,
    Register,
    Resend,
    anchor_key,
    anchor_of,
    decode_message,
    encode_message,
    kademlia_member_key,
    make_placement,
    make_query,
)
from .model import Req, SimConfig, SimNode
from .network import PEER_ID_BYTES, find_node_request_bytes, find_node_response_bytes, stream_request_bytes, stream_response_bytes

__all__ = ["DirectoryMode"]


class DirectoryMode:
    """Directory discovery for the simulator (see the module docstring)."""

    # Provided by the simulator.
    config: SimConfig
    now: float
    alive: list[SimNode]
    by_id: dict[str, SimNode]
    rng_phase: random.Random
    rng_loss: random.Random
    at: Callable[..., None]
    link_s: Callable[[SimNode, SimNode], float]
    _load_tick: Callable[[SimNode], None]
    _expire_tick: Callable[[SimNode], None]
    _decide: Callable[..., None]

    def _init_directory(self, config: DirectoryConfig) -> None:
        self.dir_cfg = config
        self.membership = make_placement(config)
        self.dir_count: Counter[str] = Counter()
        self.dir_bytes: Counter[str] = Counter()
        self.dir_lost = 0
        self.dir_timeouts = 0
        self.dir_blind = 0
        self.dir_answered = 0
        self.dir_empty = 0
        self.lookup_ms: list[float] = []
        self.query_ns: list[int] = []
        self._lookup_seq = 0
        # KadDHT placement: the DHT's own traffic (see the module docstring).
        self.dht_on = config.placement == "kademlia"
        self.dht_keys: list[int] = []
        """Routing-table keys of the members, sorted."""
        self.dht_members: dict[str, int] = {}
        """Member -> its routing-table key."""
        self.dht_version = 0
        self.dht_lookups: Counter[str] = Counter()
        """DHT lookups by reason: ``refresh`` (routing table), ``resolve`` (an anchor)."""
        self.dht_find_nodes = 0
        self._dht_complete: dict[str, tuple[int, bool]] = {}
        self._dht_closest: dict[int, tuple[int, list[str]]] = {}
        self.rng_dht = random.Random(f"{self.config.seed}-dht")

    def _add_directory_node(self, node: SimNode) -> None:
        """Directory discovery: an anchor tracker on the cache, a directory
        store, load reports in the node's topic, and membership (rendezvous)."""
        cfg, d = self.config, self.dir_cfg
        node.anchors = AnchorTracker(node.router.hasher, d.anchor_blocks)
        node.cache.subscribe(node.anchors.on_event)
        node.store = DirectoryStore(node.router.hasher.block_size, max_blocks_per_holder=self.dir_cfg.max_blocks_per_holder,
                                    max_holders=self.dir_cfg.max_holders)
        g = cfg.gossip
        phase = self.rng_phase.random
        self.at(self.now + phase() * g.load_interval_s, self._load_tick, node)
        self.at(self.now + g.peer_ttl_s / 2, self._expire_tick, node)
        self.at(self.now + phase() * d.update_interval_s, self._dir_update_tick, node)
        self.at(self.now + (1 + phase()) * d.refresh_s, self._dir_refresh_tick, node)
        self.at(self.now + d.entry_ttl_s / 2, self._dir_expire_tick, node)
        if self.dht_on:
            node.resolve = ResolveSchedule(RESOLVE_TTL_S)
        if self.now == 0.0:
            self.membership.add(node.id)  # the initial swarm
            self._dht_member(node.id, True)
            if self.dht_on:  # running for a while already: refreshes at random phases
                self.at(phase() * ROUTING_TABLE_REFRESH_S, self._dht_refresh_tick, node)
        else:
            self.at(self.now + cfg.membership_delay_s, self._member_join, node)

    def _member_join(self, node: SimNode) -> None:
        if node.alive:
            self._dht_member(node.id, True)
            self._placement_changed(self.membership.add(node.id))
            if self.dht_on:  # KadDHT refreshes its routing table when it starts
                self._dht_refresh_tick(node)

    def _member_leave(self, node: SimNode) -> None:
        self._dht_member(node.id, False)
        changed = self.membership.remove(node.id)
        for other in self.alive:
            other.store.drop_holder(node.id)  # type: ignore[union-attr]
        self._placement_changed(changed)

    def _placement_changed(self, anchors: list[int]) -> None:
        """Anchors moved: former owners forget them, holders re-register in full."""
        if not anchors:
            return
        moved = set(anchors)
        for n in self.alive:
            store = n.store
            assert store is not None and n.anchors is not None
            for a in moved.intersection(store.anchors()):
                if n.id not in self.membership.owners(a):
                    store.drop_anchor(a)
            held = moved.intersection(n.anchors.anchors())
            if held:
                self._send_updates(n, n.anchors.full(held), "register")

    def _send_updates(
        self, node: SimNode, updates: list[AnchorUpdate], kind: str, checks: Sequence[AnchorCheck] = (), only: str | None = None
    ) -> None:
        """Batch anchor updates (and checks) per owner: one Register message
        (stream) each; ``only``: to that owner alone (a resync)."""
        if not updates and not checks:
            return
        batches: dict[str, tuple[list[AnchorUpdate], list[AnchorCheck]]] = {}
        if only is None and self.dht_on:
            self._dht_resolve(node, {u.anchor for u in updates} | {c.anchor for c in checks})
        for u in updates:
            for owner in [only] if only else self.membership.owners(u.anchor):
                batches.setdefault(owner, ([], []))[0].append(u)
        for c in checks:
            for owner in self.membership.owners(c.anchor):
                batches.setdefault(owner, ([], []))[1].append(c)
        load = node.load()
        epoch = node.router.tracker.epoch
        for owner_id, (ups, cks) in batches.items():
            msg = Register(node.id, epoch, load, tuple(ups), tuple(cks))
            if owner_id == node.id:
                resend = node.store.apply(msg, self.now)  # type: ignore[union-attr]
                if resend:
                    self._send_updates(node, node.anchors.full(resend, clear_pending=False), "resync", only=node.id)  # type: ignore[union-attr]
                continue
            data = encode_message(msg)
            owner = self.by_id[owner_id]
            self.dir_count[kind] += 1
            self.at(self.now + self.link_s(node, owner), self._dir_register_arrive, node, owner, data, kind)

    def _dir_register_arrive(self, src: SimNode, dst: SimNode, data: bytes, kind: str) -> None:
        if not dst.alive or (self.config.loss and self.rng_loss.random() < self.config.loss):
            self.dir_lost += 1
            return
        inbound = stream_request_bytes(len(data))
        dst.bytes_in += inbound
        dst.bytes_by_kind[kind] += inbound
        self.dir_bytes[kind] += inbound
        msg = decode_message(data)
        assert isinstance(msg, Register)
        resend = dst.store.apply(msg, self.now)  # type: ignore[union-attr]
        # The reply carries a Resend when some checked anchors did not match.
        reply = encode_message(Resend(tuple(resend))) if resend else None
        ack = stream_response_bytes(None if reply is None else len(reply))
        if src.alive:
            src.bytes_in += ack
            src.bytes_by_kind[kind] += ack
            self.dir_bytes[kind] += ack
        if reply is not None:
            self.at(self.now + self.link_s(dst, src), self._dir_resend_arrive, src, dst, reply)

    def _dir_resend_arrive(self, src: SimNode, dst: SimNode, reply: bytes) -> None:
        if not src.alive:
            return
        msg = decode_message(reply)
        assert isinstance(msg, Resend)
        self._send_updates(src, src.anchors.full(msg.anchors, clear_pending=False), "resync", only=dst.id)  # type: ignore[union-attr]

    def _dir_update_tick(self, node: SimNode) -> None:
        if not node.alive:
            return
        self._send_updates(node, node.anchors.take_updates(), "register")  # type: ignore[union-attr]
        self.at(self.now + self.dir_cfg.update_interval_s, self._dir_update_tick, node)

    def _dir_refresh_tick(self, node: SimNode) -> None:
        if not node.alive:
            return
        anchors = node.anchors
        assert anchors is not None
        if self.dir_cfg.refresh == "checksum":
            # Pending changes go first, in the same message, so that the checks match.
            self._send_updates(node, anchors.take_updates(), "refresh", checks=anchors.checks())
        else:
            self._send_updates(node, anchors.full(), "refresh")
        self.at(self.now + self.dir_cfg.refresh_s, self._dir_refresh_tick, node)

    def _dir_expire_tick(self, node: SimNode) -> None:
        if not node.alive:
            return
        node.store.expire(self.now, self.dir_cfg.entry_ttl_s)  # type: ignore[union-attr]
        self.at(self.now + self.dir_cfg.entry_ttl_s / 2, self._dir_expire_tick, node)

    def _lookup(self, req: Req, node: SimNode) -> None:
        """Ask the owner of the request's anchor (one round trip), then decide."""
        t0 = time.perf_counter_ns()
        router = node.router
        req.hashes = router.hasher.hashes(req.tokens)
        d = self.dir_cfg
        anchor = anchor_of(req.hashes, d.anchor_blocks)
        owners = self.membership.owners(anchor) if anchor is not None else []
        hash_ns = time.perf_counter_ns() - t0
        if not owners:
            self._decide(req, node, None, hash_ns)
            return
        query = make_query(req.hashes, req.n_tokens, d)
        assert query is not None
        if self.dht_on and self._dht_resolve(node, [query.anchor]):
            # The live entry waits for its DHT lookup (one round) before it asks.
            self.at(self.now + 2 * self.latency.typical_ms / 1000.0, self._ask, req, node, query, 0, hash_ns)
            return
        self._ask(req, node, query, 0, hash_ns)

    def _ask(self, req: Req, node: SimNode, query: Query, attempt: int, hash_ns: int) -> None:
        d = self.dir_cfg
        owners = askable_owners(self.membership.owners(query.anchor), node.id, lambda o: node.distrusts(o, self.now))
        if not owners:
            self._decide(req, node, None, hash_ns)
            return
        # Replicas share the queries (each request asks one of them, a retry
        # the next); an entry that is itself an owner asks itself.
        owner_id = node.id if node.id in owners else owners[(req.rid + attempt) % len(owners)]
        if owner_id == node.id:
            answer = node.store.answer(query, self.now, exclude=node.id)  # type: ignore[union-attr]
            self.dir_answered += 1
            self.dir_empty += not answer.holders
            self._decide(req, node, answer, hash_ns)
            return
        self._lookup_seq += 1
        token = req.lookup = self._lookup_seq
        data = encode_message(query)
        owner = self.by_id[owner_id]
        self.dir_count["query"] += 1
        self.at(self.now + self.link_s(node, owner), self._dir_query_arrive, req, req.gen, token, node, owner, data, hash_ns)
        self.at(self.now + d.query_timeout_s, self._dir_timeout, req, req.gen, token, node, query, attempt, hash_ns)

    def _dir_query_arrive(self, req: Req, gen: int, token: int, entry: SimNode, owner: SimNode, data: bytes, hash_ns: int) -> None:
        if not owner.alive or (self.config.loss and self.rng_loss.random() < self.config.loss):
            self.dir_lost += 1
            return  # the entry's timeout decides
        inbound = stream_request_bytes(len(data))
        owner.bytes_in += inbound
        owner.bytes_by_kind["query"] += inbound
        t0 = time.perf_counter_ns()
        query = decode_message(data)
        assert isinstance(query, Query)
        answer = owner.store.answer(query, self.now, exclude=entry.id)  # type: ignore[union-attr]
        reply = encode_message(answer)
        self.query_ns.append(time.perf_counter_ns() - t0)
        back = stream_response_bytes(len(reply))
        self.dir_bytes["query"] += inbound
        self.dir_count["answer"] += 1
        if self.config.loss and self.rng_loss.random() < self.config.loss:
            self.dir_lost += 1
            return
        self.at(self.now + self.link_s(owner, entry), self._dir_answer_arrive, req, gen, token, entry, reply, back, hash_ns, owner.id)

    def _dir_answer_arrive(
        self, req: Req, gen: int, token: int, entry: SimNode, reply: bytes, back: int, hash_ns: int, owner: str
    ) -> None:
        if not entry.alive:
            return
        entry.bytes_in += back
        entry.bytes_by_kind["answer"] += back
        self.dir_bytes["answer"] += back
        if gen != req.gen or req.done or req.lookup != token:
            return  # timed out already, or the client went elsewhere
        req.lookup = 0
        answer = decode_message(reply)
        assert isinstance(answer, Answer)
        self.dir_answered += 1
        self.dir_empty += not answer.holders
        self._decide(req, entry, answer, hash_ns, owner)

    def _dir_timeout(self, req: Req, gen: int, token: int, entry: SimNode, query: Query, attempt: int, hash_ns: int) -> None:
        if gen != req.gen or req.done or req.lookup != token or not entry.alive:
            return
        req.lookup = 0
        self.dir_timeouts += 1
        if attempt + 1 < self.dir_cfg.query_attempts:
            self._ask(req, entry, query, attempt + 1, hash_ns)  # a lost message or a dead owner: once more
        else:
            self.dir_blind += 1
            self._decide(req, entry, None, hash_ns)  # decide with what the entry knows

    # -- KadDHT: the placement's own traffic ---------------------------------------------
    def _dht_member(self, member: str, joined: bool) -> None:
        if not self.dht_on:
            return
        key = int.from_bytes(kademlia_member_key(member), "big")
        if joined and member not in self.dht_members:
            insort(self.dht_keys, key)
            self.dht_members[member] = key
        elif not joined and member in self.dht_members:
            del self.dht_keys[bisect_left(self.dht_keys, key)]
            del self.dht_members[member]
        else:
            return
        self.dht_version += 1

    def _dht_table_complete(self, node: SimNode) -> bool:
        cached = self._dht_complete.get(node.id)
        if cached is None or cached[0] != self.dht_version:
            complete = routing_table_complete(kbucket_sizes(self.dht_keys, exclude=self.dht_members.get(node.id)))
            cached = self._dht_complete[node.id] = (self.dht_version, complete)
        return cached[1]

    def _dht_resolve(self, node: SimNode, anchors: Iterable[int]) -> int:
        """The lookups ``DhtPlacement.resolve`` makes for these anchors (none while the
        table is complete); returns how many. The initial swarm has been running: an
        anchor it meets first is taken as looked up at a random time in the last TTL."""
        sched = node.resolve
        assert sched is not None
        anchors = list(anchors)
        if node.joined_at == 0.0:
            for a in anchors:
                if a not in sched:
                    sched.mark(a, self.now - self.rng_dht.random() * sched.ttl_s)
        due = sched.due(anchors, self.now, self._dht_table_complete(node))
        for a in due:
            target = int.from_bytes(hashlib.sha256(anchor_key(a)).digest(), "big")
            self._dht_lookup(node, self._dht_nearest(a, target), len(anchor_key(a)), "resolve")
        return len(due)

    def _dht_nearest(self, cache_key: int | None, target: int, k: int = BUCKET_SIZE) -> list[str]:
        """The ``k`` members closest to ``target`` (py-libp2p's XOR metric), cached per anchor."""
        if cache_key is not None:
            cached = self._dht_closest.get(cache_key)
            if cached is not None and cached[0] == self.dht_version:
                return cached[1]
        nearest = [m for m, _ in heapq.nsmallest(k, self.dht_members.items(), key=lambda kv: kv[1] ^ target)]
        if cache_key is not None:
            self._dht_closest[cache_key] = (self.dht_version, nearest)
        return nearest

    def _dht_lookup(self, node: SimNode, nearest: list[str] | None, key_len: int, reason: str) -> None:
        """One ``find_closest_peers_network``: FIND_NODE to the closest members
        (``nearest``; ``None``: a random key, whose closest are any members)."""
        members = len(self.dht_members)
        queries = lookup_queries(members - (node.id in self.dht_members))
        if not queries:
            return
        if nearest is None:
            others = [m for m in self.dht_members if m != node.id]
            asked = [self.by_id[m] for m in self.rng_dht.sample(others, min(queries, len(others)))]
        else:
            asked = [self.by_id[m] for m in nearest if m != node.id][:queries]
        self.dht_lookups[reason] += 1
        # Each answer: the responder's closest (its table: the members less itself), less the asker.
        answer = find_node_response_bytes(max(0, min(BUCKET_SIZE, members - 2)))
        request = find_node_request_bytes(key_len)
        kind = "dht " + reason
        for peer in asked:
            self.dht_find_nodes += 1
            if not peer.alive:
                continue  # a departed member: the request is lost, no answer
            peer.bytes_in += request
            peer.bytes_by_kind[kind] += request
            node.bytes_in += answer
            node.bytes_by_kind[kind] += answer
            self.dir_bytes[kind] += request + answer
            self.dir_count[kind] += 1

    def _dht_refresh_tick(self, node: SimNode) -> None:
        """KadDHT's routing-table refresh: its own id, then a random key per non-empty bucket."""
        if not node.alive:
            return
        key = self.dht_members.get(node.id)
        if key is None:
            return
        sizes = kbucket_sizes(self.dht_keys, exclude=key)
        self._dht_lookup(node, self._dht_nearest(None, key, BUCKET_SIZE + 1), PEER_ID_BYTES, "refresh")
        for _ in range(refresh_lookups(sizes) - 1):
            self._dht_lookup(node, None, 32, "refresh")
        self.at(self.now + ROUTING_TABLE_REFRESH_S, self._dht_refresh_tick, node)
