"""A discrete-event simulator of a p2pinfer swarm, running the real core.

Every simulated node owns what a live node owns: a
:class:`~p2pinfer.core.radix.RadixTree` cache under a token budget, a
:class:`~p2pinfer.core.router.Router` (digest tracker, peer view, policy
object) and a FIFO queue served one request at a time, like one llama.cpp
context. Digests travel between routers as the encoded CBOR bytes
``Router.take_delta()`` / ``Router.full_digest()`` produce, on the
:class:`~p2pinfer.core.router.GossipConfig` schedule; what changes is only
the clock (virtual, a heap of events) and the engine (prefill and decode
times from :class:`~p2pinfer.core.costmodel.EngineCostModel`, with reuse
read from the node's real radix match).

A request: arrives at an entry node (Poisson arrivals, a random live node);
the entry's router decides; a forward travels one link delay, the target
serves it or refuses with BUSY (its queued prefill is over the threshold),
in which case the entry backs off from it (``Router.on_busy_refusal``) and
tries its fallbacks; the first token travels one link delay back. Time to
first token is measured at the entry node, so a forward pays two one-way
hops. A node that leaves loses its queue and cache; the entries of its
requests notice one link delay later and re-route, and clients of a node
that left retry at another node. Each arrival completes exactly once.

Each encoded message is decoded once and the resulting digest is applied to
every receiver's router (``Router.on_digest``): that is what
``Router.on_digest_bytes`` does per receiver, without decoding the same
bytes a thousand times.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
import hashlib
import heapq
import math
import os
import random
import statistics
import time
from typing import Any

from ..core.attempts import Action, Done, Fail, ForwardTo, PeerLost, Refused, RequestAttempts, Sanction, ServeHere
from ..core.blocks import ModelFingerprint
from ..core.costmodel import EngineCostModel
from ..core.digest import Digest, decode_digest
from ..core.engine_queue import EngineQueue, Ticket
from ..core.directory import (
    AnchorCheck,
    Answer,
    AnchorTracker,
    AnchorUpdate,
    DirectoryConfig,
    DirectoryStore,
    DirectoryView,
    Query,
    Register,
    Rendezvous,
    Resend,
    anchor_of,
    apply_answer,
    decode_message,
    encode_message,
    make_query,
)
from ..core.peers import Load
from ..core.policies import POLICIES, CostModel, CostPolicy, Decision, LocalState, RouteRequest
from ..core.radix import RadixTree
from ..core.router import GossipConfig, Router, RouterConfig, TrustConfig
from ..workloads.base import PromptEncoder, TimedRequest
from .network import (
    DEFAULT_ENVELOPE_BYTES,
    DEFAULT_MESH_DEGREE,
    LatencyModel,
    digest_message_bytes,
    gossip_copies,
    load_report_bytes,
    mesh_hops,
    parse_latency,
    stream_request_bytes,
    stream_response_bytes,
)
from .cpu import SharedCpu
from .oracle import OracleIndex, OraclePolicy

__all__ = ["SIM_POLICIES", "SimConfig", "SimNode", "Simulator", "default_fingerprint"]

SIM_POLICIES = (*POLICIES, "oracle")
"""Every core policy plus the simulator-only oracle."""
DISCOVERY = ("gossip", "directory")
"""How nodes learn who caches what: gossiped digests, or the prefix directory."""
DIRECTORY_NEIGHBOURHOOD = 8
"""Directory mode: load reports are gossiped in topics of this many nodes
unless ``topic_size`` says otherwise."""

_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def _peer_id(seed: int, idx: int) -> str:
    """A 52-character id shaped like a libp2p Ed25519 peer id, so digest and
    load report sizes are realistic."""
    n = int.from_bytes(hashlib.sha256(f"p2pinfer-sim-{seed}-{idx}".encode()).digest(), "big")
    chars = []
    for _ in range(44):
        n, r = divmod(n, 58)
        chars.append(_B58[r])
    return "12D3KooW" + "".join(chars)


def _memory_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def default_fingerprint(tokenizer_name: str) -> ModelFingerprint:
    return ModelFingerprint("SmolLM2-135M-Instruct.Q4_1", tokenizer_name, "none")


@dataclass(frozen=True)
class SimConfig:
    """Everything that defines a run; stated in every result."""

    nodes: int = 4
    policy: str = "cost"
    latency: str = "1"
    """One-way delay per hop in ms, or uniform:LO:HI / lognormal:MEDIAN:SIGMA."""
    loss: float = 0.0
    """Probability that one receiver misses one gossip message."""
    cache_tokens: int = 10_000
    """Per node KV cache budget (SmolLM2: about 23 KB per token, so 230 MB)."""
    busy_valve: bool = True
    busy_queue_ms: float = RouterConfig().busy_queue_ms
    busy_backoff_s: float = 2.0
    gossip: GossipConfig = field(default_factory=GossipConfig)
    instant_gossip: bool = False
    """Every change reaches every node at once, losslessly (for the oracle test)."""
    topic_size: int = 0
    """0: one gossip topic for the whole swarm; else random topics of this many
    nodes, each routing only among its own members. With the directory, topics
    carry only load reports (default DIRECTORY_NEIGHBOURHOOD nodes)."""
    discovery: str = "gossip"
    """gossip: digests gossiped in topics; directory: the content-sharded prefix
    directory (p2pinfer/core/directory.py) plus load reports in topics."""
    directory: DirectoryConfig = field(default_factory=DirectoryConfig)
    membership_delay_s: float = 3.0
    """Directory: how long until the membership (and so rendezvous placement)
    reflects a join or a leave; meanwhile messages to a departed owner are lost."""
    mesh_degree: int = DEFAULT_MESH_DEGREE
    envelope_bytes: int = DEFAULT_ENVELOPE_BYTES
    concurrency: int = 0
    """0: requests arrive at their own times (open loop). Else a closed loop
    like ``bench swarm``'s client: this many in flight, the next one sent
    when one completes, in order (their times are ignored)."""
    shared_cores: float = 0.0
    """0: every node is its own machine. Else every node runs on one machine
    with this many cores, shared (processor sharing, ``sim/cpu.py``): the
    setting of a live benchmark swarm started on one box."""
    churn_interval_s: float = 0.0
    """Mean seconds between two node replacements in the swarm (0: no churn)."""
    rejoin_delay_s: float = 5.0
    max_attempts: int = RouterConfig().max_attempts
    """Peers an entry tries for one request before it serves locally (RouterConfig.max_attempts)."""
    client_retry_s: float = 1.0
    """A client whose entry node died retries at another node after this long."""
    warmup: float = 0.1
    """Share of the first arrivals left out of the statistics (cold caches)."""
    cost: EngineCostModel = field(default_factory=EngineCostModel)
    work_weight: float = CostModel().work_weight
    """CostModel.work_weight of the cost and oracle policies (default: the core's)."""
    drain_reported_queue: bool = True
    """CostModel.drain_reported_queue of the cost policy (an ablation switch)."""
    trust: TrustConfig = field(default_factory=TrustConfig)
    seed: int = 1
    record_decisions: bool = False
    record_timeline: bool = False
    shadow_oracle: bool = False
    """Also compute the oracle's decision at every ``cost`` decision and count agreement."""

    def validate(self) -> None:
        if self.nodes < 1:
            raise ValueError("need at least one node")
        if self.policy not in SIM_POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}; choose from {', '.join(SIM_POLICIES)}")
        if not 0 <= self.loss < 1:
            raise ValueError("loss must be in [0, 1)")
        if self.cache_tokens < 0 or self.topic_size < 0 or self.mesh_degree < 1:
            raise ValueError("cache_tokens, topic_size must be >= 0 and mesh_degree >= 1")
        if not 0 <= self.warmup < 1:
            raise ValueError("warmup must be in [0, 1)")
        if self.concurrency < 0:
            raise ValueError("concurrency must be >= 0 (0: open loop)")
        if self.shared_cores < 0:
            raise ValueError("shared_cores must be >= 0 (0: one machine per node)")
        if self.discovery not in DISCOVERY:
            raise ValueError(f"unknown discovery {self.discovery!r}; choose from {', '.join(DISCOVERY)}")
        if self.discovery == "directory" and self.instant_gossip:
            raise ValueError("instant gossip is a gossip-discovery setting")
        if self.membership_delay_s < 0:
            raise ValueError("membership_delay_s must be >= 0")
        parse_latency(self.latency)
        need, have = self.view_memory_estimate(), _memory_bytes()
        if have and need > 0.6 * have:
            raise ValueError(
                f"{self.nodes} nodes in topics of {self.topic_nodes()} may need {need / 2**30:.0f} GiB for the "
                f"peer views (each node indexes every block its topic peers cache), more than 60 % of this "
                f"machine's {have / 2**30:.0f} GiB: use --topic-size or fewer nodes"
            )

    def topic_nodes(self) -> int:
        size = self.topic_size or (DIRECTORY_NEIGHBOURHOOD if self.discovery == "directory" else 0)
        return min(size, self.nodes) if size else self.nodes

    def view_memory_estimate(self) -> int:
        """Bytes the peer views may need: every node indexes every block its
        topic peers cache (a dict entry and a holder set, about 300 bytes
        each in CPython); an upper bound, caches full."""
        if self.policy == "oracle":
            return 0
        blocks = self.cache_tokens // 16
        if self.discovery == "directory":
            # Each cached block is registered at one directory per replica.
            return self.nodes * blocks * 300 * self.directory.replicas
        return self.nodes * max(0, self.topic_nodes() - 1) * blocks * 300

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["cost"] = self.cost.as_dict()
        return d


class Req:
    """One client request, across its forwards, refusals and retries."""

    __slots__ = (
        "rid", "arrival", "tokens", "n_tokens", "label", "output_tokens", "entry", "gen", "attempts",
        "first_token", "done", "served_by", "reused", "forwards", "retries", "predicted", "fixed_entry",
        "hashes", "lookup", "routed_at",
    )

    def __init__(self, rid: int, arrival: float, tokens: list[int], label: str, output_tokens: int, fixed_entry: int | None) -> None:
        self.rid = rid
        self.arrival = arrival
        self.tokens = tokens
        self.n_tokens = len(tokens)
        self.label = label
        self.output_tokens = output_tokens
        self.fixed_entry = fixed_entry
        self.entry: SimNode | None = None
        self.gen = 0
        self.attempts: RequestAttempts | None = None
        """Its lifecycle at the current entry node (a client retry starts another)."""
        self.first_token: float | None = None
        self.done = False
        self.served_by: SimNode | None = None
        self.reused = 0
        self.forwards = 0
        self.retries = 0
        self.predicted = 0
        self.hashes: list[int] = []
        self.lookup = 0
        """Directory lookup in flight (a token), 0 when none."""
        self.routed_at = arrival


class Job:
    __slots__ = ("req", "gen", "origin", "predicted", "ticket", "reused", "in_service", "started", "work_s")

    def __init__(self, req: Req, origin: SimNode, predicted: int) -> None:
        self.req = req
        self.gen = req.gen
        self.origin = origin
        self.predicted = predicted
        self.ticket: Ticket | None = None
        """Its place in the node's EngineQueue."""
        self.reused = 0
        self.in_service: list[int] = []
        """Block hashes listed in the node's digest while it serves this job."""
        self.started = 0.0
        self.work_s = 0.0
        """Its prefill at full speed (it takes longer on shared cores)."""


class SimNode:
    """A node: cache, router, FIFO queue. ``load()`` is what its engine reports."""

    def __init__(self, idx: int, node_id: str, router: Router, cost: EngineCostModel, topic: int, now: float) -> None:
        self.idx = idx
        self.id = node_id
        self.router = router
        self.cache = router.cache
        self.topic = topic
        self.alive = True
        self.queue: deque[Job] = deque()
        self.current: Job | None = None
        self.engine = EngineQueue(ms_per_token=cost.prefill_ms_per_token)
        """Its engine's queue accounting, the very model a live engine keeps."""
        self.busy_flag = False
        self.served = 0
        self.busy_s = 0.0
        self.joined_at = now
        self.left_at: float | None = None
        self.bytes_in = 0
        """Discovery bytes this node received (gossip copies and direct messages)."""
        self.bytes_by_kind: Counter[str] = Counter()
        self.anchors: AnchorTracker | None = None
        self.store: DirectoryStore | None = None
        self.sanctioned: dict[str, float] = {}
        """Peer id -> virtual time its sanction ends: until then what it says is dropped
        (the live node's :class:`~p2pinfer.net.sanctions.PeerSanctions`)."""

    def distrusts(self, peer_id: str, now: float) -> bool:
        until = self.sanctioned.get(peer_id)
        if until is None:
            return False
        if now >= until:
            del self.sanctioned[peer_id]
            return False
        return True

    def load(self) -> Load:
        return self.engine.load()

    def new_attempts(self, decision: Decision, tokens: list[int], hashes: list[int]) -> RequestAttempts:
        """The lifecycle of a request entering here (as ``Node.generate`` builds it)."""
        return RequestAttempts(self.router, decision, tokens, hashes)



class Simulator:
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
        self.need_oracle = config.policy == "oracle" or config.shadow_oracle
        self.oracle_index = OracleIndex() if self.need_oracle else None
        self.gossip_on = config.policy != "oracle" and config.nodes > 1
        self.dir_on = self.gossip_on and config.discovery == "directory"
        self.dir_cfg = config.directory
        self.membership = Rendezvous(replicas=config.directory.replicas)
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

    # -- event queue ---------------------------------------------------------
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

    def refuses(self, node: SimNode) -> bool:
        return node.router.is_busy(node.load())

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
        node_id = _peer_id(self.config.seed, idx)
        router = self._new_router(idx, node_id, RadixTree(self.config.cache_tokens))
        topic = self._assign_topic()
        node = SimNode(idx, node_id, router, self.config.cost, topic, self.now)
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
        return CostPolicy(model=CostModel(work_weight=cfg.work_weight, drain_reported_queue=cfg.drain_reported_queue))

    # -- gossip --------------------------------------------------------------
    def _publish(self, src: SimNode, kind: str, obj: Any, payload_len: int, wire_len: int) -> None:
        members = self.topics[src.topic]
        n = len(members)
        if n <= 1:
            return
        cfg = self.config
        self.msg_count[kind] += 1
        self.msg_bytes[kind] += wire_len
        per_receiver = (wire_len + cfg.envelope_bytes) * gossip_copies(n, cfg.mesh_degree)
        delay = mesh_hops(n, cfg.mesh_degree) * self.latency.typical_ms / 1000.0
        self.at(self.now + delay, self._deliver, src, kind, obj, per_receiver)

    def _publish_digest(self, src: SimNode, data: bytes) -> None:
        digest = decode_digest(data)
        self._publish(src, digest.kind, digest, len(data), digest_message_bytes(len(data)))

    def _publish_load(self, src: SimNode) -> None:
        load = src.load()
        busy = src.router.is_busy(load)
        tracker = src.router.tracker
        wire = load_report_bytes(
            src.id, self.fingerprint_hex, load.queued_prefill_tokens, load.active_requests, busy, tracker.epoch, tracker.version
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
        self._publish_digest(node, node.router.full_digest())
        self.at(self.now + self.config.gossip.full_interval_s, self._full_tick, node)

    def _load_tick(self, node: SimNode) -> None:
        if not node.alive:
            return
        self._publish_load(node)
        self.at(self.now + self.config.gossip.load_interval_s, self._load_tick, node)

    def _expire_tick(self, node: SimNode) -> None:
        if not node.alive:
            return
        ttl = self.config.gossip.peer_ttl_s
        node.router.view.expire(self.now, ttl)
        self.at(self.now + ttl / 2, self._expire_tick, node)

    def _sync_instant(self) -> None:
        """Instantaneous lossless gossip: every node's changes and load, now."""
        now = self.now
        alive = self.alive
        for src in alive:
            data = src.router.take_delta()
            digest: Digest | None = decode_digest(data) if data is not None else None
            load = src.load()
            busy = src.router.is_busy(load)
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
        busy = node.router.is_busy(node.load())
        if busy != node.busy_flag:
            node.busy_flag = busy
            self._publish_load(node)

    # -- the prefix directory -------------------------------------------------
    def _add_directory_node(self, node: SimNode) -> None:
        """Directory discovery: an anchor tracker on the cache, a directory
        store, load reports in the node's topic, and membership (rendezvous)."""
        cfg, d = self.config, self.dir_cfg
        node.anchors = AnchorTracker(node.router.hasher, d.anchor_blocks)
        node.cache.subscribe(node.anchors.on_event)
        node.store = DirectoryStore(node.router.hasher.block_size)
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
        owners = self.membership.owners(query.anchor)
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
        self.at(self.now + self.link_s(owner, entry), self._dir_answer_arrive, req, gen, token, entry, reply, back, hash_ns)

    def _dir_answer_arrive(self, req: Req, gen: int, token: int, entry: SimNode, reply: bytes, back: int, hash_ns: int) -> None:
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
        self._decide(req, entry, answer, hash_ns)

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

    def _decide(self, req: Req, node: SimNode, answer: Answer | None, hash_ns: int) -> None:
        """The entry's decision: the node's own policy object over its peer
        view plus the directory's answer (the same CostPolicy code)."""
        router = node.router
        now = self.now
        t0 = time.perf_counter_ns()
        if answer is not None and node.sanctioned:
            answer = Answer(answer.anchor, tuple(h for h in answer.holders if not node.distrusts(h.holder, now)))
        if answer is not None and answer.holders:
            apply_answer(router.view, answer, now, self.fingerprint_hex)
        bs = router.hasher.block_size
        match = max(node.cache.match(req.tokens, touch=False), router.in_service_match(req.hashes))
        local = LocalState(node.id, match, node.load(), True)
        request = RouteRequest(req.n_tokens, req.hashes, bs)
        decision = router.policy.decide(request, local, DirectoryView(router.view, answer, bs), now, router.rng)  # type: ignore[arg-type]
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
                req.forwards += 1
                self.at(self.now + self.link_s(entry, peer), self._forward_arrive, req, req.gen, entry, peer, predicted)
            elif isinstance(action, ServeHere):
                req.predicted = action.predicted_match_tokens
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
        elif self.refuses(peer):
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
        job.ticket = node.engine.admit(tokens, node.cache.match(tokens, touch=False))
        job.in_service = router.begin_serving(tokens, hashes=hashes)
        node.queue.append(job)
        if node.engine.can_start():
            self._start(node)
        self._check_busy(node)

    def _start(self, node: SimNode) -> None:
        job = node.queue.popleft()
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
        if job.gen == req.gen and not req.done:
            back = 0.0 if job.origin is node else self.link_s(node, job.origin)
            req.first_token = self.now + back
            req.served_by = node
            req.reused = job.reused
            if job.origin is not node and self.dir_on:
                self.at(self.now + back, self._first_token_arrive, job.origin, node)
        else:
            self.orphaned += 1
        decode = self.config.cost.decode_ms(req.output_tokens) / 1000.0
        node.busy_s += decode
        self._compute(node, decode, self._done, node, job)
        self._check_busy(node)

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
        req = job.req
        if job.gen == req.gen and not req.done:
            req.done = True
            node.served += 1
            del self.pending[req.rid]
            req.tokens = []  # free memory; its length is kept below
            self.completed.append(req)
            if self.config.record_timeline:
                self.timeline.append((self.now, req.label, node.idx))
            if job.origin is node:
                self._act(req, node, req.attempts.handle(Done(job.reused), self.now))  # type: ignore[union-attr]
            else:
                self.at(self.now + self.link_s(node, job.origin), self._forward_done, req, job.origin, job.reused)
            if self.progress is not None and len(self.completed) % 50 == 0:
                self.progress(len(self.completed), len(self.requests))
            if self.config.concurrency and self._next_send < len(self.requests):
                # Closed loop: the client hears the end one link later and sends the next.
                back = 0.0 if job.origin is node else self.link_s(node, job.origin)
                self.at(self.now + back, self._arrive, self._next_send)
                self._next_send += 1
        if node.queue:
            self._start(node)

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
        self.topics[node.topic].remove(node)
        if self.oracle_index is not None:
            self.oracle_index.detach(node.idx)
        if self.dir_on:
            self.at(self.now + self.config.membership_delay_s, self._member_leave, node)
        jobs = list(node.queue) + ([node.current] if node.current is not None else [])
        node.queue.clear()
        node.current = None
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
        from .metrics import summarise

        return summarise(self, wall_s)


def with_policy(config: SimConfig, policy: str) -> SimConfig:
    return replace(config, policy=policy)

