"""What a simulated swarm is made of: the run's configuration, its nodes,
requests and jobs (no behaviour beyond their own bookkeeping).

:class:`SimNode` owns what a live node owns: a
:class:`~p2pinfer.core.radix.RadixTree` cache, a
:class:`~p2pinfer.core.router.Router` and the engine's queue accounting
(:class:`~p2pinfer.core.engine_queue.EngineQueue`); the simulator
(``simulator.py``) moves them on a virtual clock.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
import hashlib
import os
from typing import Any

from ..core.attempts import RequestAttempts
from ..core.blocks import ModelFingerprint
from ..core.costmodel import EngineCostModel
from ..core.dht import ResolveSchedule
from ..core.directory import AnchorTracker, DirectoryConfig, DirectoryStore
from ..core.engine_queue import EngineQueue, Ticket
from ..core.peers import Load
from ..core.policies import POLICIES, TtftEstimator, Decision
from ..core.radix import PinHandle
from ..core.router import AnnounceSchedule, GossipConfig, Router, RouterConfig, TrustConfig
from ..core.verify import CheckPlan, SpotChecks, VerifyConfig
from .network import DEFAULT_ENVELOPE_BYTES, DEFAULT_MESH_DEGREE, parse_latency

__all__ = [
    "DIRECTORY_NEIGHBOURHOOD",
    "DISCOVERY",
    "LOAD_TOPICS",
    "SIM_POLICIES",
    "Job",
    "Req",
    "SimConfig",
    "SimNode",
    "default_fingerprint",
    "sim_peer_id",
]

SIM_POLICIES = (*POLICIES, "oracle")
"""Every core policy plus the simulator-only oracle."""
DISCOVERY = ("gossip", "directory")
LOAD_TOPICS = ("hash", "fill")
"""Directory discovery: load topics by the live node's hash, or filled at random (the old model)."""
"""How nodes learn who caches what: gossiped digests, or the prefix directory."""
DIRECTORY_NEIGHBOURHOOD = 8
"""Directory mode: load reports are gossiped in topics of this many nodes
unless ``topic_size`` says otherwise."""

_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def sim_peer_id(seed: int, idx: int) -> str:
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
    load_topics: str = "hash"
    """Directory discovery only: how nodes are put in load topics. ``hash``:
    as the live node (:mod:`p2pinfer.core.load_topics`), about ``nodes /
    topic_nodes()`` topics (a power of two), a node's topic the SHA-256 of
    its id modulo that count, recomputed from the live swarm's size at each
    load tick; ``fill``: random topics filled to exactly ``topic_nodes()``
    (the figures published before load topics were live)."""
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
    work_weight: float = TtftEstimator().work_weight
    """TtftEstimator.work_weight of the cost and oracle policies (default: the core's)."""
    drain_reported_queue: bool = True
    """TtftEstimator.drain_reported_queue of the cost policy (an ablation switch)."""
    touch_on_admit: bool = True
    """As the engines do (issue 22): a request accepted into a node's queue
    marks its cached prefix as used now, so that the prompts queued ahead of
    it do not evict it before it starts. False: only the start touches it
    (an ablation switch)."""
    trust: TrustConfig = field(default_factory=TrustConfig)
    seed: int = 1
    record_decisions: bool = False
    reply_cache: bool = False
    """As a live node's ``reply_cache``: when a request ends, its serving node
    caches prompt + reply (the workload's ``Prompt.reply``). Off by default
    so that earlier figures reproduce; on in live nodes."""
    record_timeline: bool = False
    shadow_oracle: bool = False
    """Also compute the oracle's decision at every ``cost`` decision and count agreement."""
    slots: int = 1
    """Requests each node serves at once. 1 (the default, so that earlier
    figures reproduce): one at a time, a whole answer after the other. More:
    the llama.cpp engine's continuous batching (``batching.py``): prompt
    chunks interleaved with decode steps batched over the decoding slots,
    priced by ``EngineCostModel.decode_step_ms``."""
    verify: VerifyConfig | None = None
    """None (the default, so that earlier figures reproduce): forwarded answers
    are not checked. Else the live node's answer checks with this
    configuration (``answer_checks.py``): an entry holds a new peer's answers
    until checked on its own engine (probation) and spot-checks the others;
    one slot only."""
    check_cache: bool = True
    """With ``verify``: a check leaves its prompt in the checking node's cache
    (the engines' ``check_cache``; off in ``bench directory``'s live nodes)."""

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
        if self.load_topics not in LOAD_TOPICS:
            raise ValueError(f"unknown load_topics {self.load_topics!r}; choose from {', '.join(LOAD_TOPICS)}")
        if self.discovery == "directory" and self.instant_gossip:
            raise ValueError("instant gossip is a gossip-discovery setting")
        if self.membership_delay_s < 0:
            raise ValueError("membership_delay_s must be >= 0")
        if self.slots < 1:
            raise ValueError("slots must be >= 1")
        if self.verify is not None and self.slots > 1:
            raise ValueError("answer checks (verify) are modelled with one slot per node only")
        parse_latency(self.latency)
        need, have = self.view_memory_estimate(), _memory_bytes()
        if have and need > 0.6 * have:
            raise ValueError(
                f"{self.nodes} nodes in topics of {self.topic_nodes()} may need {need / 2**30:.0f} GiB for the "
                f"peer views (each node indexes every block its topic peers cache), more than 60 % of this "
                f"machine's {have / 2**30:.0f} GiB: use --topic-size or fewer nodes"
            )

    def hashed_load_topics(self) -> bool:
        """Load reports in the live node's hashed topics (directory discovery, ``load_topics = "hash"``)."""
        return self.discovery == "directory" and self.load_topics == "hash"

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
        "hashes", "lookup", "routed_at", "reply", "check", "released",
    )

    def __init__(self, rid: int, arrival: float, tokens: list[int], label: str, output_tokens: int, fixed_entry: int | None) -> None:
        self.rid = rid
        self.arrival = arrival
        self.tokens = tokens
        self.n_tokens = len(tokens)
        self.label = label
        self.output_tokens = output_tokens
        self.reply: list[int] = []
        """Tokens the next turn renders after the prompt (cached at the end with ``reply_cache``)."""
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
        self.check: CheckPlan = "none"
        """How its entry checks the answer of its current forward (``SpotChecks.plan``)."""
        self.released = False
        """A held answer's first token has reached the client (its check passed)."""


class Job:
    __slots__ = (
        "req", "gen", "origin", "predicted", "ticket", "reused", "in_service", "started", "work_s",
        "cuts", "pin", "prefill_wall_s", "generated", "decode_steps", "decode_s",
    )

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
        # With several slots (batching.py):
        self.cuts: list[int] = []
        """Sizes of its prompt chunks still to evaluate, the next first (empty: prefill done or not started)."""
        self.pin: PinHandle | None = None
        """Its cached prefix, pinned from its start to the end of its prefill."""
        self.prefill_wall_s = 0.0
        """Time its chunks took (longer than ``work_s`` on shared cores)."""
        self.generated = 0
        self.decode_steps = 0
        self.decode_s = 0.0
        """Time of the decode steps it took part in (what a live engine measures its decode speed from)."""


class SimNode:
    """A node: cache, router, FIFO queue and its EngineQueue; ``load()`` is what its engine reports."""

    def __init__(
        self,
        idx: int,
        node_id: str,
        router: Router,
        cost: EngineCostModel,
        topic: int,
        now: float,
        *,
        slots: int = 1,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.idx = idx
        self.id = node_id
        self.router = router
        self.cache = router.cache
        self.topic = topic
        self.topic_count = 0
        """Hashed load topics: the count its topic is one of (0: not hashed)."""
        self.alive = True
        self.queue: deque[Job] = deque()
        """Accepted, waiting for a slot, in arrival order."""
        self.current: Job | None = None
        """With one slot: the job it serves."""
        self.slots = slots
        self.running: list[Job] = []
        """With several slots: the jobs in them, in admission order."""
        self.computing = False
        """With several slots: a prompt chunk or a decode step is being computed."""
        self._clock = clock
        self.engine = EngineQueue(
            ms_per_token=cost.prefill_ms_per_token,
            slots=slots,
            # With several slots the wait for one is estimated from the decode speed (starting from the
            # calibrated single-sequence one, then what its answers measure, as a live engine does).
            decode_ms_per_token=cost.decode_ms_per_token if slots > 1 else None,
        )
        """Its engine's queue accounting, the very model a live engine keeps."""
        self.said_busy = False
        """What its last load report said (the valve is edge-triggered)."""
        self.served = 0
        self.busy_s = 0.0
        self.joined_at = now
        self.left_at: float | None = None
        self.bytes_in = 0
        """Discovery bytes this node received (gossip copies and direct messages)."""
        self.bytes_by_kind: Counter[str] = Counter()
        self.anchors: AnchorTracker | None = None
        self.store: DirectoryStore | None = None
        self.resolve: ResolveSchedule | None = None
        """KadDHT placement: the anchors this node looked up in the DHT, and when."""
        self.sanctioned: dict[str, float] = {}
        """Peer id -> virtual time its sanction ends: until then what it says is dropped
        (the live node's :class:`~p2pinfer.net.sanctions.PeerSanctions`)."""
        self.schedule = AnnounceSchedule(router.config.gossip)
        """When it publishes load reports and full digests (the live node's rule)."""
        self.published_version = 0
        """The digest version its last published digest carried (its load reports name it)."""
        self.checks: SpotChecks | None = None
        """With ``SimConfig.verify``: which forwarded answers it checks (the live node's object)."""

    def distrusts(self, peer_id: str, now: float) -> bool:
        until = self.sanctioned.get(peer_id)
        if until is None:
            return False
        if now >= until:
            del self.sanctioned[peer_id]
            return False
        return True

    def load(self) -> Load:
        """Its engine's load report now (the wait for a free slot needs the clock)."""
        return self.engine.load(None if self._clock is None else self._clock())

    def is_busy(self) -> bool:
        """It refuses forwarded work now, as ``Node.is_busy`` (a simulated node
        has no limit on forwards in flight, only the queue threshold)."""
        return self.router.over_busy_queue(self.load())

    def new_attempts(self, decision: Decision, tokens: list[int], hashes: list[int]) -> RequestAttempts:
        """The lifecycle of a request entering here (as ``Node.generate`` builds it)."""
        return RequestAttempts(self.router, decision, tokens, hashes)
