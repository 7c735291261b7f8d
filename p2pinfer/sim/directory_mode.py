"""The simulator's prefix-directory mode (``--discovery directory``).

Holders register their anchors' blocks with each anchor's owners (batched
``Register`` messages, checksum refreshes, ``Resend`` on a mismatch); an
entry asks the owner of a request's anchor (``Query`` / ``Answer``, one
round trip, a timeout and a retry) and then decides with the answer
(``Simulator._decide``). The messages are the core's
(:mod:`p2pinfer.core.directory`), encoded and decoded as on the wire, so
their sizes are real. A mixin of :class:`~p2pinfer.sim.simulator.Simulator`:
the event loop, the nodes and the decision stay there.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
import random
import time

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
    Rendezvous,
    Resend,
    anchor_of,
    decode_message,
    encode_message,
    make_placement,
    make_query,
)
from .model import Req, SimConfig, SimNode
from .network import stream_request_bytes, stream_response_bytes

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
        if self.now == 0.0:
            self.membership.add(node.id)  # the initial swarm
        else:
            self.at(self.now + cfg.membership_delay_s, self._member_join, node)

    def _member_join(self, node: SimNode) -> None:
        if node.alive:
            self._placement_changed(self.membership.add(node.id))

    def _member_leave(self, node: SimNode) -> None:
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
