"""A discrete-event simulator of a p2pinfer swarm, running the real core.

Every simulated node owns what a live node owns (``model.py``): a
:class:`~p2pinfer.core.radix.RadixTree` cache under a token budget, a
:class:`~p2pinfer.core.router.Router` (digest tracker, peer view, policy
object) and its engine's queue accounting
(:class:`~p2pinfer.core.engine_queue.EngineQueue`), served one request at a
time (``slots=1``, the default), or ``slots`` at once with batched decode
steps and chunked prefills like the llama.cpp engine's slot loop
(``batching.py``). Digests travel between routers as the
encoded CBOR bytes ``Router.take_delta()`` / ``Router.full_digest()``
produce, on the :class:`~p2pinfer.core.router.GossipConfig` schedule; what
changes is only the clock (virtual, a heap of events) and the engine
(prefill and decode times from
:class:`~p2pinfer.core.costmodel.EngineCostModel`, with reuse read from the
node's real radix match).

A request: arrives at an entry node (Poisson arrivals, a random live node);
the entry's router decides and the core's
:class:`~p2pinfer.core.attempts.RequestAttempts` (the same object a live
node runs) says what to do: a forward travels one link delay, the target
serves it or refuses with BUSY (its queued prefill is over the threshold),
and the lifecycle backs off from it and tries the next candidate; the first
token travels one link delay back, and so does the end of the forward, with
its realised reuse (trust). Time to first token is measured at the entry
node, so a forward pays two one-way hops. A node that leaves loses its queue
and cache; the entries of its requests notice one link delay later
(``PeerLost``) and re-route, and clients of a node that left retry at
another node (a new lifecycle there). Each arrival completes exactly once.
The prefix directory is in ``directory_mode.py``.

Each encoded message is decoded once and the resulting digest is applied to
every receiver's router (``Router.on_digest``): that is what
``Router.on_digest_bytes`` does per receiver, without decoding the same
bytes a thousand times.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
import heapq
import math
import random
import time
from typing import Any

from ..core.attempts import Action, Done, Fail, ForwardTo, PeerLost, Refused, Sanction, ServeHere
from ..core.digest import Digest, decode_digest
from ..core.directory import Answer, DirectoryView, apply_answer, vouched_by
from ..core.peers import Load
from ..core.policies import TtftEstimator, CostPolicy, Decision, LocalState, RouteRequest
from ..core.radix import RadixTree
from ..core.router import Router, RouterConfig
from ..core.verify import SpotChecks
from ..workloads.base import PromptEncoder, TimedRequest
from .answer_checks import AnswerChecks, CheckJob
from .batching import SlotBatching
from .cpu import SharedCpu
from .directory_mode import DirectoryMode
from .hashed_topics import HashedTopics
from .metrics import summarise
from .model import SIM_POLICIES, Job, Req, SimConfig, SimNode, default_fingerprint, sim_peer_id
from .network import LatencyModel, digest_message_bytes, gossip_copies, load_report_bytes, mesh_hops, parse_latency
from .oracle import OracleIndex, OraclePolicy

__all__ = ["SIM_POLICIES", "SimConfig", "SimNode", "Simulator", "default_fingerprint"]

class Simulator(SlotBatching, DirectoryMode, HashedTopics, AnswerChecks):
    """One run: ``Simulator(config, requests, encoder).run()`` -> result dict."""

    def __init__(
        self,
        config: SimConfig,
        requests: Sequence[TimedRequest],
        encoder: PromptEncoder,
        *,
        workload: dict[str, Any] | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        config.validate()
        if not requests:
            raise ValueError("no requests to simulate")
        self.config = config
        self.requests = requests
        self.encoder = encoder
        self.workload = workload or {}
        self.progress = progress
        self.latency: LatencyModel = parse_latency(config.latency, config.seed)
        self.fingerprint = default_fingerprint(encoder.tokenizer.name)
        self.fingerprint_hex = self.fingerprint.hex()
        self.router_config = RouterConfig(
            policy="cost" if config.policy == "oracle" else config.policy,
            busy_queue_ms=config.busy_queue_ms if config.busy_valve else math.inf,
            busy_backoff_s=config.busy_backoff_s,
            max_attempts=config.max_attempts,
            gossip=config.gossip,
            trust=config.trust,
        )
        seed = config.seed
        self.rng_entry = random.Random(f"{seed}-entry")
        self.rng_loss = random.Random(f"{seed}-loss")
        self.rng_churn = random.Random(f"{seed}-churn")
        self.rng_topic = random.Random(f"{seed}-topic")
        self.rng_phase = random.Random(f"{seed}-phase")
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = 0
        self._next_send = 0
        """Closed loop: index of the next request to send."""
        self.cpu = SharedCpu(config.shared_cores, self.at, lambda: self.now) if config.shared_cores else None
        self.nodes: list[SimNode] = []
        self.by_id: dict[str, SimNode] = {}
        self.alive: list[SimNode] = []
        self.topics: list[list[SimNode]] = []
        self._init_hashed_topics()
        self.need_oracle = config.policy == "oracle" or config.shadow_oracle
        self.oracle_index = OracleIndex() if self.need_oracle else None
        self.gossip_on = config.policy != "oracle" and config.nodes > 1
        self.dir_on = self.gossip_on and config.discovery == "directory"
        self._init_directory(config.directory)
        self.pending: dict[int, Req] = {}
        self.completed: list[Req] = []
        self.arrived = 0
        # statistics
        self.decision_ns: list[int] = []
        self.decisions: list[tuple[int, str, str, int]] = []
        self.shadow_total = 0
        self.shadow_agree = 0
        self.msg_count: Counter[str] = Counter()
        self.msg_bytes: Counter[str] = Counter()
        self.msg_bytes_in: Counter[str] = Counter()
        self.apply_results: Counter[str] = Counter()
        self.bytes_in = 0
        self.deliveries = 0
        self.lost = 0
        self.refusals = 0
        self.failures = 0
        self.retries = 0
        self.sanctions = 0
        self.gossip_dropped = 0
        """Gossip copies dropped because the receiver sanctions their sender."""
        self.orphaned = 0
        self.joins = 0
        self.leaves = 0
        self.timeline: list[tuple[float, str, int]] = []
        self.events = 0
        self.check_stats: Counter[str] = Counter()
        """Answer checks (SimConfig.verify): plans drawn, checks run, their tokens."""
        self._windows_in_check: dict[tuple[int, int], tuple[Job, SimNode] | None] = {}

    # -- event queue ---------------------------------------------------------
    def _clock(self) -> float:
        return self.now

    def at(self, t: float, fn: Callable[..., None], *args: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, fn, args))

    def _compute(self, node: SimNode, work_s: float, fn: Callable[..., None], *args: Any) -> None:
        """``work_s`` of engine work on ``node`` at full speed, then ``fn(*args)``."""
        if self.cpu is None:
            self.at(self.now + work_s, fn, *args)
        else:
            self.cpu.start(node, work_s, fn, *args)

    # -- topology ------------------------------------------------------------
    def link_s(self, a: SimNode, b: SimNode) -> float:
        return self.latency.link_ms(a.idx, b.idx) / 1000.0

    def rtt_ms(self, a: SimNode, b: SimNode) -> float:
        return 2.0 * self.latency.link_ms(a.idx, b.idx)

    def live_nodes(self) -> list[SimNode]:
        return self.alive


    def _assign_topic(self) -> int:
        size = self.config.topic_nodes() if self.config.topic_nodes() < self.config.nodes else 0
        if not size:
            if not self.topics:
                self.topics.append([])
            return 0
        open_topics = [i for i, t in enumerate(self.topics) if len(t) < size]
        if open_topics:
            return self.rng_topic.choice(open_topics)
        self.topics.append([])
        return len(self.topics) - 1

    def _add_node(self) -> SimNode:
        idx = len(self.nodes)
        node_id = sim_peer_id(self.config.seed, idx)
        router = self._new_router(idx, node_id, RadixTree(self.config.cache_tokens))
        count = 0
        if self.config.hashed_load_topics():
            # The initial swarm knows its size; a joining node counts itself in.
            count, topic = self._hashed_topic(node_id, self.config.nodes if self.now == 0.0 else len(self.alive) + 1)
        else:
            topic = self._assign_topic()
        node = SimNode(idx, node_id, router, self.config.cost, topic, self.now, slots=self.config.slots, clock=self._clock)
        node.topic_count = count
        if self.config.verify is not None:
            node.checks = SpotChecks(self.config.verify, random.Random(f"{self.config.seed}-checks-{idx}"))
        if self.config.policy == "cost":
            router.policy = self._cost_rule()
        if self.config.policy == "oracle":
            router.policy = OraclePolicy(self, node, self._cost_rule())
        self.nodes.append(node)
        self.by_id[node_id] = node
        self.alive.append(node)
        self.topics[topic].append(node)
        if self.oracle_index is not None:
            self.oracle_index.attach(idx, router.tracker)
        if self.dir_on:
            self._add_directory_node(node)
        elif self.gossip_on and not self.config.instant_gossip:
            g = self.config.gossip
            phase = self.rng_phase.random
            self.at(self.now + phase() * g.delta_interval_s, self._delta_tick, node)
            self.at(self.now + phase() * g.full_interval_s + g.full_interval_s, self._full_tick, node)
            self.at(self.now + phase() * g.load_interval_s, self._load_tick, node)
            self.at(self.now + g.peer_ttl_s / 2, self._expire_tick, node)
            # A node announces itself with a full digest when it joins.
            self._publish_digest(node, node.router.full_digest())
        elif self.gossip_on:
            self._announce_instant(node)
        return node

    def _new_router(self, idx: int, node_id: str, cache: RadixTree) -> Router:
        """Node ``idx``'s router (the lab overrides this to plant a lying node)."""
        return Router(node_id, self.fingerprint, cache, config=self.router_config, seed=self.config.seed * 1_000_003 + idx)

    def _announce_instant(self, node: SimNode) -> None:
        """Instant gossip: a joining node and the others exchange full digests now."""
        now = self.now
        mine = decode_digest(node.router.full_digest())
        for other in self.alive:
            if other is node:
                continue
            other.router.on_digest(mine, now)
            node.router.on_digest(decode_digest(other.router.full_digest()), now)

    def _cost_rule(self) -> CostPolicy:
        cfg = self.config
        return CostPolicy(estimator=TtftEstimator(work_weight=cfg.work_weight, drain_reported_queue=cfg.drain_reported_queue))

    # -- gossip --------------------------------------------------------------
    def _publish(self, src: SimNode, kind: str, obj: Any, payload_len: int, wire_len: int) -> None:
        members = self.topics[src.topic]
        n = len(members)
        if n <= 1:
            return
        cfg = self.config
        self.msg_count[kind] += 1
        self.msg_bytes[kind] += wire_len
        extra = self.topic_extra_bytes.get(src.topic, 0)  # a load topic's longer name (hashed topics)
        per_receiver = (wire_len + cfg.envelope_bytes + extra) * gossip_copies(n, cfg.mesh_degree)
        delay = mesh_hops(n, cfg.mesh_degree) * self.latency.typical_ms / 1000.0
        self.at(self.now + delay, self._deliver, src, kind, obj, per_receiver)

    def _publish_digest(self, src: SimNode, data: bytes) -> None:
        digest = decode_digest(data)
        src.published_version = digest.version
        if digest.kind == "full":
            src.schedule.full_sent(digest.epoch, digest.version)
        self._publish(src, digest.kind, digest, len(data), digest_message_bytes(len(data)))

    def _publish_load(self, src: SimNode, load: Load | None = None, busy: bool | None = None) -> None:
        load = src.load() if load is None else load
        busy = src.router.over_busy_queue(load) if busy is None else busy
        src.schedule.load_sent(load, busy, self.now, self._load_extra(src))
        tracker = src.router.tracker
        wire = load_report_bytes(
            src.id, self.fingerprint_hex, load.queued_prefill_tokens, load.active_requests, busy, tracker.epoch, tracker.version,
            slots=load.slots, free_slots=load.free_slots, slot_wait_ms=load.slot_wait_ms,
        )
        self._publish(src, "load", (load, busy), wire, wire)

    def _deliver(self, src: SimNode, kind: str, obj: Any, per_receiver: int) -> None:
        now = self.now
        loss = self.config.loss
        rng = self.rng_loss
        src_id = src.id
        delivered = 0
        is_load = kind == "load"
        results = self.apply_results
        for r in self.topics[src.topic]:
            if r is src or not r.alive:
                continue
            if loss and rng.random() < loss:
                self.lost += 1
                continue
            if r.sanctioned and r.distrusts(src_id, now):
                self.gossip_dropped += 1
                continue
            delivered += 1
            r.bytes_in += per_receiver
            r.bytes_by_kind["gossip " + kind] += per_receiver
            router = r.router
            if is_load:
                router.on_load(src_id, obj[0], obj[1], now)
            else:
                results[router.on_digest(obj, now)] += 1
            view = router.view
            state = view.get(src_id)
            if state is not None and not state.fingerprint and is_load:
                # A LoadReport names its model fingerprint (protos/p2pinfer.proto).
                state.fingerprint = self.fingerprint_hex
            if state is not None and state.rtt_ms is None:
                view.set_rtt(src_id, self.rtt_ms(src, r), now)
        self.deliveries += delivered
        self.bytes_in += delivered * per_receiver
        self.msg_bytes_in[kind] += delivered * per_receiver

    def _delta_tick(self, node: SimNode) -> None:
        if not node.alive:
            return
        data = node.router.take_delta()
        if data is not None:
            self._publish_digest(node, data)
        self.at(self.now + self.config.gossip.delta_interval_s, self._delta_tick, node)

    def _full_tick(self, node: SimNode) -> None:
        if not node.alive:
            return
        tracker = node.router.tracker
        if node.schedule.full_due(tracker.epoch, tracker.version):
            self._publish_digest(node, node.router.full_digest())
        self.at(self.now + self.config.gossip.full_interval_s, self._full_tick, node)

    @staticmethod
    def _load_extra(node: SimNode) -> tuple[object, ...]:
        """What the live node's load report carries that may change: the digest version it names."""
        return (node.router.tracker.epoch, node.published_version)

    def _load_tick(self, node: SimNode) -> None:
        if not node.alive:
            return
        if node.topic_count:
            self._retopic(node)
        load = node.load()
        busy = node.router.over_busy_queue(load)
        # Every simulated node is directly connected to every other, so an idle one
        # sends no keep-alive (GossipConfig.keepalive_interval_s): as a live node
        # whose peers are all directly connected.
        if node.schedule.load_due(load, busy, self.now, self._load_extra(node), keepalive=False):
            self._publish_load(node, load, busy)
        self.at(self.now + self.config.gossip.load_interval_s, self._load_tick, node)

    def _expire_tick(self, node: SimNode) -> None:
        if not node.alive:
            return
        ttl = self.config.gossip.peer_ttl_s
        view = node.router.view
        # The live node's liveness probes of its directly connected peers (not counted,
        # like its RTT probes): a live peer stays in the view; one that left is dropped
        # when its connections close (_leave).
        for member in self.topics[node.topic]:
            if member is not node and member.alive and member.id in view:
                view.add(member.id, self.now)
        view.expire(self.now, ttl)
        self.at(self.now + ttl / 2, self._expire_tick, node)

    def _sync_instant(self) -> None:
        """Instantaneous lossless gossip: every node's changes and load, now."""
        now = self.now
        alive = self.alive
        for src in alive:
            data = src.router.take_delta()
            digest: Digest | None = decode_digest(data) if data is not None else None
            load = src.load()
            busy = src.router.over_busy_queue(load)
            for r in alive:
                if r is src or (r.sanctioned and r.distrusts(src.id, now)):
                    continue
                if digest is not None:
                    self.apply_results[r.router.on_digest(digest, now)] += 1
                r.router.on_load(src.id, load, busy, now)
                if r.router.view.get(src.id).rtt_ms is None:  # type: ignore[union-attr]
                    r.router.view.set_rtt(src.id, self.rtt_ms(src, r), now)

    def _check_busy(self, node: SimNode) -> None:
        """The valve is edge-triggered too: a node says so as soon as it is busy."""
        if not self.config.busy_valve or not self.gossip_on or self.config.instant_gossip:
            return
        busy = node.is_busy()
        if busy != node.said_busy:
            node.said_busy = busy
            self._publish_load(node)

    def _decide(self, req: Req, node: SimNode, answer: Answer | None, hash_ns: int, owner: str | None = None) -> None:
        """The entry's decision: the node's own policy object over its peer
        view plus the directory's answer from ``owner`` (the same CostPolicy
        code; the holders it vouches for as the live node's ``route_tokens``)."""
        router = node.router
        now = self.now
        t0 = time.perf_counter_ns()
        if answer is not None and node.sanctioned:
            answer = Answer(answer.anchor, tuple(h for h in answer.holders if not node.distrusts(h.holder, now)))
        vouched: tuple[tuple[str, str], ...] = ()
        if answer is not None and answer.holders:
            vouched = vouched_by(router.view, answer, req.hashes, owner or node.id)
            apply_answer(router.view, answer, now, self.fingerprint_hex)
        bs = router.hasher.block_size
        match = max(node.cache.match(req.tokens, touch=False), router.in_service_match(req.hashes))
        local = LocalState(node.id, match, node.load(), True)
        request = RouteRequest(req.n_tokens, req.hashes, bs)
        decision = router.policy.decide(request, local, DirectoryView(router.view, answer, bs), now, router.rng)  # type: ignore[arg-type]
        if vouched:
            decision = replace(decision, vouched_by=vouched)
        self.decision_ns.append(time.perf_counter_ns() - t0 + hash_ns)
        self.lookup_ms.append((now - req.routed_at) * 1000.0)
        self._begin(req, node, decision, req.hashes)

    # -- requests ------------------------------------------------------------
    def _arrive(self, i: int) -> None:
        tr = self.requests[i]
        if i + 1 < len(self.requests) and not self.config.concurrency:
            self.at(self.requests[i + 1].t, self._arrive, i + 1)
        p = tr.prompt
        req = Req(i, self.now, self.encoder.encode(p), p.label, p.output_tokens, tr.entry)
        if self.config.reply_cache:
            req.reply = self.encoder.encode_reply(p)
        self.pending[i] = req
        self.arrived += 1
        alive = self.alive
        entry = alive[tr.entry % len(alive)] if tr.entry is not None else alive[self.rng_entry.randrange(len(alive))]
        self._route(req, entry)

    def _route(self, req: Req, node: SimNode) -> None:
        req.entry = node
        if self.dir_on:
            req.routed_at = self.now
            self._lookup(req, node)
            return
        if self.config.instant_gossip:
            self._sync_instant()
        router = node.router
        now = self.now
        oracle_decision = None
        if self.config.shadow_oracle:
            rng = random.Random()
            rng.setstate(router.rng.getstate())
            saved = router.policy
            router.policy = OraclePolicy(self, node, self._cost_rule())
            saved_rng, router.rng = router.rng, rng
            oracle_decision, _ = router.route(req.tokens, node.load(), now)
            router.policy, router.rng = saved, saved_rng
        t0 = time.perf_counter_ns()
        decision, hashes = router.route(req.tokens, node.load(), now)
        self.decision_ns.append(time.perf_counter_ns() - t0)
        if oracle_decision is not None:
            self.shadow_total += 1
            self.shadow_agree += oracle_decision.target == decision.target
        self._begin(req, node, decision, hashes)

    def _begin(self, req: Req, entry: SimNode, decision: Decision, hashes: list[int]) -> None:
        """The entry's lifecycle of this request: the core's RequestAttempts, as on a live node."""
        if self.config.record_decisions:
            self.decisions.append((req.rid, entry.id, decision.target, decision.predicted_match_tokens))
        req.attempts = entry.new_attempts(decision, req.tokens, hashes)
        self._act(req, entry, req.attempts.start())

    def _act(self, req: Req, entry: SimNode, actions: list[Action]) -> None:
        """Carry out the lifecycle's actions on the virtual clock."""
        for action in actions:
            if isinstance(action, ForwardTo):
                req.predicted = predicted = action.predicted_match_tokens
                peer = self.by_id[action.peer]
                req.check, req.released = self._plan_check(entry, action.peer), False
                req.forwards += 1
                self.at(self.now + self.link_s(entry, peer), self._forward_arrive, req, req.gen, entry, peer, predicted)
            elif isinstance(action, ServeHere):
                req.predicted = action.predicted_match_tokens
                req.check = "none"
                self._enqueue(entry, Job(req, entry, action.predicted_match_tokens))
            elif isinstance(action, Sanction):
                self._sanction(entry, action.peer)
            elif isinstance(action, Fail):  # a simulated entry always serves what falls back to it
                raise RuntimeError(f"request {req.rid} failed at {entry.id}: {action.message}")
            # Finish: a request completes where it is served (_done), for the statistics.

    def _forward_arrive(self, req: Req, gen: int, origin: SimNode, peer: SimNode, predicted: int) -> None:
        if gen != req.gen or req.done:
            return
        back = self.now + self.link_s(peer, origin)
        if not peer.alive:
            self.at(back, self._forward_failed, req, gen, origin, peer)
        elif peer.is_busy():
            self.at(back, self._forward_refused, req, gen, origin, peer)
        else:
            self._enqueue(peer, Job(req, origin, predicted))

    def _forward_refused(self, req: Req, gen: int, origin: SimNode, peer: SimNode) -> None:
        if gen != req.gen or not origin.alive:
            return
        self.refusals += 1
        self._act(req, origin, req.attempts.handle(Refused("BUSY"), self.now))  # type: ignore[union-attr]

    def _forward_failed(self, req: Req, gen: int, origin: SimNode, peer: SimNode) -> None:
        if gen != req.gen or not origin.alive:
            return
        self.failures += 1
        self._act(req, origin, req.attempts.handle(PeerLost(), self.now))  # type: ignore[union-attr]

    # -- serving -------------------------------------------------------------
    def _enqueue(self, node: SimNode, job: Job) -> None:
        tokens = job.req.tokens
        router = node.router
        hashes = router.hasher.hashes(tokens)
        cached = node.cache.match(tokens, touch=self.config.touch_on_admit)
        job.ticket = node.engine.admit(tokens, cached, job.req.output_tokens)
        job.in_service = router.begin_serving(tokens, hashes=hashes)
        node.queue.append(job)
        if node.slots > 1:
            self._admit_slots(node)
            self._iterate(node)
        elif node.engine.can_start():
            self._start(node)
        self._check_busy(node)

    def _start(self, node: SimNode) -> None:
        job = node.queue.popleft()
        if isinstance(job, CheckJob):  # an answer check's next chunk (answer_checks.py)
            self._run_check_chunk(node, job)
            return
        node.current = job
        tokens = job.req.tokens
        # One request at a time per node: nothing else inserts into this cache
        # while it runs, so the matched prefix needs no pin.
        reused = node.cache.match(tokens)
        node.engine.start(job.ticket, reused)  # type: ignore[arg-type]
        job.reused = reused
        duration = self.config.cost.prefill_ms(len(tokens), reused) / 1000.0
        node.busy_s += duration
        job.started, job.work_s = self.now, duration
        self._compute(node, duration, self._prefill_done, node, job)

    def _prefill_done(self, node: SimNode, job: Job) -> None:
        if not node.alive:
            return
        req = job.req
        measured = None
        if self.cpu is not None and job.work_s > 0:
            # What a live engine measures: on shared cores a prefill that ran
            # beside others took longer than its work, and the speed estimate
            # carries that slowdown, so routing sees the same uneven speeds as
            # in a live run. Only shared cores slow a prefill down; without
            # them the EWMA would still drift in the last bits of a float and
            # flip tied decisions.
            measured = self.config.cost.prefill_ms_per_token * (self.now - job.started) / job.work_s
        node.engine.prefilled(job.ticket, len(req.tokens) - job.reused, measured)  # type: ignore[arg-type]
        node.cache.insert(req.tokens)
        node.router.end_serving(job.in_service)
        self._first_token(node, job)
        decode = self.config.cost.decode_ms(req.output_tokens) / 1000.0
        node.busy_s += decode
        self._compute(node, decode, self._done, node, job)
        self._check_busy(node)

    def _first_token(self, node: SimNode, job: Job) -> None:
        """``job``'s prefill is done on ``node``: its first token goes to the entry (one link back)."""
        req = job.req
        if job.gen == req.gen and not req.done:
            back = 0.0 if job.origin is node else self.link_s(node, job.origin)
            if not self._hold_first_token(node, job):
                req.first_token = self.now + back
            req.served_by = node
            req.reused = job.reused
            if job.origin is not node and self.dir_on:
                self.at(self.now + back, self._first_token_arrive, job.origin, node)
        else:
            self.orphaned += 1

    def _first_token_arrive(self, origin: SimNode, peer: SimNode) -> None:
        if origin.alive:
            state = origin.router.view.get(peer.id)
            if state is not None and state.rtt_ms is None:
                # A peer known only from an answer: the forward measured its RTT.
                origin.router.view.set_rtt(peer.id, self.rtt_ms(origin, peer), self.now)

    def _forward_done(self, req: Req, origin: SimNode, realised: int) -> None:
        """The end of a forward reaches its entry node, with the realised reuse (as a live Done)."""
        if origin.alive:
            self._act(req, origin, req.attempts.handle(Done(realised), self.now))  # type: ignore[union-attr]

    def _sanction(self, node: SimNode, peer_id: str) -> None:
        """As a live node does: the lifecycle dropped the distrusted peer from
        the view; what it says is dropped for ``distrust_s``, so it cannot come back sooner."""
        node.sanctioned[peer_id] = self.now + self.config.trust.distrust_s
        self.sanctions += 1

    def _done(self, node: SimNode, job: Job) -> None:
        if not node.alive:
            return
        node.engine.finish(job.ticket)  # type: ignore[arg-type]
        node.current = None
        self._complete(node, job)
        if node.queue:
            self._start(node)

    def _complete(self, node: SimNode, job: Job) -> None:
        """``job``'s answer ended on ``node`` (out of the engine's queue already): the request completes."""
        req = job.req
        if req.reply and req.tokens:  # the engine caches the reply when its generation ends (reply_cache)
            node.cache.insert(req.tokens + req.reply)
        if node.checks is not None:  # the work a spot check's budget is a share of
            node.checks.note_served(len(req.tokens) - job.reused + req.output_tokens)
        if job.gen == req.gen and not req.done:
            if job.origin is not node and req.check != "none":
                # Its entry checks the answer before the request ends (answer_checks.py).
                self.at(self.now + self.link_s(node, job.origin), self._answer_arrives, req, job, node)
            else:
                self._finish_request(node, job)

    def _finish_request(self, node: SimNode, job: Job, *, at_origin: bool = False) -> None:
        """``job``'s request completes, served by ``node``; ``at_origin``: its entry
        has the end already (after its answer check), else it hears it one link later."""
        req = job.req
        req.done = True
        node.served += 1
        del self.pending[req.rid]
        req.tokens = []  # free memory; its length is kept below
        self.completed.append(req)
        if self.config.record_timeline:
            self.timeline.append((self.now, req.label, node.idx))
        if job.origin is node or at_origin:
            self._act(req, job.origin, req.attempts.handle(Done(job.reused), self.now))  # type: ignore[union-attr]
        else:
            self.at(self.now + self.link_s(node, job.origin), self._forward_done, req, job.origin, job.reused)
        if self.progress is not None and len(self.completed) % 50 == 0:
            self.progress(len(self.completed), len(self.requests))
        if self.config.concurrency and self._next_send < len(self.requests):
            # Closed loop: the client hears the end one link later and sends the next.
            back = 0.0 if job.origin is node or at_origin else self.link_s(node, job.origin)
            self.at(self.now + back, self._arrive, self._next_send)
            self._next_send += 1

    # -- churn ---------------------------------------------------------------
    def _churn(self) -> None:
        if len(self.pending) == 0 and self.arrived == len(self.requests):
            return
        if len(self.alive) > 2:
            node = self.alive[self.rng_churn.randrange(len(self.alive))]
            self._leave(node)
            self.at(self.now + self.config.rejoin_delay_s, self._join)
        self.at(self.now + self.rng_churn.expovariate(1.0 / self.config.churn_interval_s), self._churn)

    def _join(self) -> None:
        self.joins += 1
        self._add_node()

    def _leave(self, node: SimNode) -> None:
        self.leaves += 1
        node.alive = False
        node.left_at = self.now
        self.alive.remove(node)
        members = self.topics[node.topic]
        members.remove(node)
        if self.gossip_on and not self.config.instant_gossip:
            # Its connections close: every topic member drops it from its view (the live
            # node's membership does so within a tick), after whatever it gossiped
            # before leaving has been delivered, so that no late message re-admits it.
            gossip_s = mesh_hops(len(members) + 1, self.config.mesh_degree) * self.latency.typical_ms / 1000.0
            for other in members:
                self.at(self.now + max(self.link_s(node, other), gossip_s), self._connection_closed, other, node)
        if self.oracle_index is not None:
            self.oracle_index.detach(node.idx)
        if self.dir_on:
            self.at(self.now + self.config.membership_delay_s, self._member_leave, node)
        jobs = list(node.queue) + ([node.current] if node.current is not None else []) + node.running
        node.queue.clear()
        node.current = None
        node.running = []
        if self.cpu is not None:
            self.cpu.cancel(node)
        served_here = {job.req.rid for job in jobs if job.gen == job.req.gen}
        for req in list(self.pending.values()):
            if req.entry is node:
                req.gen += 1  # the client lost its connection: it retries elsewhere
                self.at(self.now + self.config.client_retry_s, self._client_retry, req)
            elif req.rid in served_here and req.entry is not None:
                # The entry sees the stream break one link delay later and re-routes.
                self.at(self.now + self.link_s(node, req.entry), self._forward_failed, req, req.gen, req.entry, node)

    def _connection_closed(self, node: SimNode, gone: SimNode) -> None:
        if node.alive:
            node.router.on_peer_gone(gone.id)

    def _client_retry(self, req: Req) -> None:
        if req.done:
            return
        req.retries += 1
        self.retries += 1
        # A new entry node starts the request afresh (_route: a new RequestAttempts).
        self._route(req, self.alive[self.rng_entry.randrange(len(self.alive))])

    # -- running -------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        wall0 = time.perf_counter()
        for _ in range(self.config.nodes):
            self._add_node()
        if self.config.concurrency:
            self._next_send = min(self.config.concurrency, len(self.requests))
            for i in range(self._next_send):
                self.at(self.requests[0].t, self._arrive, i)
        else:
            self.at(self.requests[0].t, self._arrive, 0)
        if self.config.churn_interval_s > 0:
            self.at(self.rng_churn.expovariate(1.0 / self.config.churn_interval_s), self._churn)
        heap = self._heap
        pop = heapq.heappop
        total = len(self.requests)
        events = 0
        while heap and len(self.completed) < total:
            t, _, fn, args = pop(heap)
            self.now = t
            fn(*args)
            events += 1
        self.events = events
        if len(self.completed) != total:
            raise RuntimeError(f"simulation stalled: {len(self.completed)} of {total} requests completed")
        return self._result(time.perf_counter() - wall0)

    # -- results ---------------------------------------------------------------
    def _result(self, wall_s: float) -> dict[str, Any]:
        return summarise(self, wall_s)

