"""The routing state machine of one node, without I/O.

:class:`Router` ties the core together: it follows the local cache to keep
this node's digest, folds peers' digests and load reports into the
:class:`~p2pinfer.core.peers.PeerView`, asks the policy where a request goes,
and learns from what forwards really reused (trust). The live node feeds it
bytes and clock readings from libp2p; the simulator feeds it events from a
virtual clock. Both run exactly this code.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
import random
from typing import Any

from .blocks import BlockHasher, ModelFingerprint
from .digest import Digest, DigestTracker, decode_digest, encode_digest
from .peers import ApplyResult, Load, PeerView
from .policies import Decision, LocalState, Policy, RouteRequest, make_policy
from .radix import RadixTree
from .verify import VerifyConfig

__all__ = ["AnnounceSchedule", "GossipConfig", "Router", "RouterConfig", "TrustConfig"]


MESH_DEGREE = 3
"""gossipsub's mesh degree D (kept between D - 1 and D + 1), for the live
node (``net/host.py``) and the simulator (``sim/network.py``). Each message
reaches a subscriber once per mesh neighbour, so an idle swarm's keep-alives
cost N/interval x D receptions per node per second. libp2p's default D = 6
(4..12) made a node of 8 receive every keep-alive 7 times; our messages are
small and our peers also pull what they miss (``net/pull.py``), so a thinner
mesh loses little: a message takes ceil(log_D(N - 1)) hops (4 at 64 nodes,
5 at 244) instead of 3 (issue 14)."""


@dataclass(frozen=True, slots=True)
class GossipConfig:
    """Anti-entropy schedule shared by the live node and the simulator.

    An idle node with nothing new to say stays quiet but for a keep-alive
    (:class:`AnnounceSchedule`): what it costs per peer and per second is
    ``keepalive_interval_s``'s, not ``load_interval_s``'s (issue 14).
    """

    delta_interval_s: float = 0.25
    """Pending cache changes are batched and published at most this often."""
    full_interval_s: float = 5.0
    """A full digest heals whatever deltas were lost: at most this often, and
    only when the digest changed since the last full one. (A peer that missed
    the last change of a digest that no longer changes learns its version from
    the next load report and pulls it.)"""
    load_interval_s: float = 1.0
    """Load reports at most this often while the node has work or its load
    changed; at once when its busy flag flips (the hotspot valve)."""
    keepalive_interval_s: float = 10.0
    """An idle node whose load report would say nothing new repeats it this
    often (liveness, addresses and digest version), but only while some peer
    in its view is not directly connected to it, or for two intervals after
    one of its connections opened or closed (discovery: nodes that do not
    know it learn its addresses from them): a directly connected peer
    probes it instead once it has been silent for ``peer_ttl_s -
    keepalive_interval_s`` (the live node's membership), so in a swarm where
    everyone is connected to everyone an idle node publishes nothing on its
    digest topic (issue 14). The simulator's nodes are all directly connected."""
    peer_ttl_s: float = 30.0
    """A peer not heard from (gossip, digest pull, an RTT probe it answered or
    sent us) for this long leaves the view. One whose connection to us closes leaves at once (the
    live node's membership; the simulator one link delay after it left)."""
    model_interval_s: float = 60.0
    """Model announcements (which node serves which model, all models on one
    topic) this often in a swarm of up to eight nodes, longer in a larger one
    (``core.swarm_models.announce_interval_s``: each node receives the same
    number per second whatever the swarm's size), besides one at start and
    one soon after a newcomer is heard; a node silent for 2.5 intervals no
    longer counts as serving its model, and one whose connection to us closes
    stops counting at once. Live node only. Not 10 s: relayed to every mesh
    peer, the announcements were half the pubsub traffic of an idle swarm (issue 14)."""

    def __post_init__(self) -> None:
        for name in ("delta_interval_s", "full_interval_s", "load_interval_s", "keepalive_interval_s", "peer_ttl_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")
        if self.keepalive_interval_s < self.load_interval_s:
            raise ValueError("keepalive_interval_s must be at least load_interval_s")
        if self.peer_ttl_s < 2 * self.keepalive_interval_s:
            raise ValueError(
                f"peer_ttl_s ({self.peer_ttl_s:g}) must be at least twice keepalive_interval_s "
                f"({self.keepalive_interval_s:g}): an idle peer would leave the view after one lost keep-alive"
            )


class AnnounceSchedule:
    """When a node publishes its load report and its full digest.

    One rule for the live node (:mod:`p2pinfer.net.gossip`) and the
    simulator, so that the simulator's message counts are the node's:

    * a load report goes out at once when the busy flag flips; otherwise at
      most every ``load_interval_s``, and then only if the node has work
      (queued prefill or active requests: peers drain a reported queue by
      the time since the report, so its timestamp is news) or the report
      differs from the last one sent; and at least every
      ``keepalive_interval_s`` while a keep-alive is wanted (``keepalive``:
      some peer in the view is not directly connected, see
      :attr:`GossipConfig.keepalive_interval_s`);
    * a full digest goes out at most every ``full_interval_s`` and only if
      the digest (epoch, version) changed since the last full one.
    """

    __slots__ = ("config", "_load_key", "_load_at", "_busy", "_full")

    def __init__(self, config: GossipConfig) -> None:
        self.config = config
        self._load_key: tuple[object, ...] | None = None
        self._load_at = float("-inf")
        self._busy = False
        self._full: tuple[int, int] | None = None

    @staticmethod
    def _key(load: Load, extra: tuple[object, ...]) -> tuple[object, ...]:
        return (load.queued_prefill_tokens, load.prefill_ms_per_token, load.active_requests, extra)

    def load_due(
        self, load: Load, busy: bool, now: float, extra: tuple[object, ...] = (), *, keepalive: bool = True
    ) -> bool:
        """Should a load report go out now? ``extra``: anything else it carries that may change
        (addresses, reachability); ``keepalive``: whether an idle keep-alive is wanted at all."""
        if self._load_key is None or busy != self._busy:
            return True
        elapsed = now - self._load_at
        if keepalive and elapsed >= self.config.keepalive_interval_s:
            return True
        if elapsed < self.config.load_interval_s:
            return False
        if load.queued_prefill_tokens > 0 or load.active_requests > 0:
            return True
        return self._key(load, extra) != self._load_key

    def next_load_at(self, load: Load, extra: tuple[object, ...] = (), *, keepalive: bool = True) -> float:
        """When the next load report falls due if nothing else changes (busy flips aside);
        ``inf`` for an idle node that wants no keep-alive."""
        if self._load_key is None:
            return float("-inf")
        if load.queued_prefill_tokens > 0 or load.active_requests > 0 or self._key(load, extra) != self._load_key:
            return self._load_at + self.config.load_interval_s
        return self._load_at + self.config.keepalive_interval_s if keepalive else float("inf")

    def load_sent(self, load: Load, busy: bool, now: float, extra: tuple[object, ...] = ()) -> None:
        self._load_key = self._key(load, extra)
        self._load_at = now
        self._busy = busy

    def full_due(self, epoch: int, version: int) -> bool:
        return self._full != (epoch, version)

    def full_sent(self, epoch: int, version: int) -> None:
        self._full = (epoch, version)


@dataclass(frozen=True, slots=True)
class TrustConfig:
    """How a peer that overclaims its cache loses our traffic."""

    smoothing: float = 0.3
    """Weight of the newest realised/predicted ratio in the running trust."""
    floor: float = 0.5
    """Below this trust the peer is ignored for ``distrust_s``."""
    distrust_s: float = 120.0
    min_predicted_tokens: int = 32
    """Forwards predicted to reuse fewer tokens say nothing about honesty."""


@dataclass(frozen=True, slots=True)
class RouterConfig:
    policy: str = "cost"
    busy_queue_ms: float = 15000.0
    """A node whose queued prefill exceeds this much work says it is busy.

    15 s, not less: at 4 s the valve fired on ordinary queues (two cold
    five-shot MMLU prompts) and the forced cold recomputes cost 18 % mean
    TTFT at moderate load; 15 s still cuts the p99 of a hot-subject hotspot
    under the paper policy from 31 s to 17 s (simulator, docs/results.md,
    issue 6)."""
    busy_backoff_s: float = 2.0
    """How long peers stay away from a node that said it was busy."""
    max_attempts: int = 3
    """Peers an entry node tries for one request (the chosen one and its
    fallbacks, see :mod:`~p2pinfer.core.attempts`) before it serves locally."""
    gossip: GossipConfig = field(default_factory=GossipConfig)
    trust: TrustConfig = field(default_factory=TrustConfig)
    verify: VerifyConfig = field(default_factory=VerifyConfig)
    """Which forwarded answers are checked against this node's model (:mod:`~p2pinfer.core.verify`)."""

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")


class Router:
    def __init__(
        self,
        node_id: str,
        fingerprint: ModelFingerprint,
        cache: RadixTree,
        *,
        config: RouterConfig | None = None,
        secret: bytes | None = None,
        policy: Policy | None = None,
        seed: int | None = None,
    ) -> None:
        self.node_id = node_id
        self.config = config or RouterConfig()
        self.hasher = BlockHasher(fingerprint, secret)
        self.cache = cache
        self.rng = random.Random(seed)
        self.tracker = DigestTracker(self.hasher, node_id, epoch=self.rng.getrandbits(63))
        for seq in cache.sequences():  # an engine may start warm
            self.tracker.on_event_insert(seq)
        cache.subscribe(self.tracker.on_event)
        self.view = PeerView(self.tracker.fingerprint, node_id)
        self.policy: Policy = policy or make_policy(self.config.policy)
        self.serving_listeners: list[Callable[[], None]] = []
        """Called when a request starts or ends being served here (the live
        node's gossip wakes up on it instead of polling the load)."""

    @property
    def fingerprint_hex(self) -> str:
        return self.tracker.fingerprint

    # -- deciding --------------------------------------------------------------
    def route(
        self,
        tokens: Sequence[int],
        local_load: Load,
        now: float,
        *,
        can_serve: bool = True,
        hashes: list[int] | None = None,
        view: Any = None,
    ) -> tuple[Decision, list[int]]:
        """Decide where ``tokens`` go; also returns their block hashes.

        ``hashes``: the block hashes when the caller has them already;
        ``view``: what the policy reads instead of :attr:`view` (a
        :class:`~p2pinfer.core.directory.DirectoryView` with the prefix
        directory's answer)."""
        if hashes is None:
            hashes = self.hasher.hashes(tokens)
        match = max(self.cache.match(tokens, touch=False), self.in_service_match(hashes))
        local = LocalState(self.node_id, match, local_load, can_serve)
        request = RouteRequest(len(tokens), hashes, self.hasher.block_size)
        return self.policy.decide(request, local, self.view if view is None else view, now, self.rng), hashes

    # -- requests this node serves ----------------------------------------------
    def begin_serving(self, tokens: Sequence[int], *, hashes: list[int] | None = None) -> list[int]:
        """This node's engine took ``tokens``: list their blocks in our digest
        until :meth:`end_serving` (see :class:`~p2pinfer.core.digest.DigestTracker`).
        Returns the block hashes to hand back to :meth:`end_serving`;
        ``hashes``, when the caller has them already, saves hashing again."""
        if hashes is None:
            hashes = self.hasher.hashes(tokens)
        self.tracker.add_in_service(hashes)
        for listener in self.serving_listeners:
            listener()
        return hashes

    def end_serving(self, hashes: Sequence[int]) -> None:
        self.tracker.remove_in_service(hashes)
        for listener in self.serving_listeners:
            listener()

    def in_service_match(self, hashes: Sequence[int]) -> int:
        """Tokens of a prompt that a request in service here will have cached
        by the time a request queued now starts (FIFO, one at a time)."""
        return self.tracker.in_service_blocks(hashes) * self.hasher.block_size

    def over_busy_queue(self, load: Load) -> bool:
        """Queued prefill work over ``busy_queue_ms``: the node's valve (see ``Node.is_busy``)."""
        return load.queued_prefill_tokens * load.prefill_ms_per_token > self.config.busy_queue_ms

    # -- learning from peers ------------------------------------------------------
    def on_digest(self, digest: Digest, now: float) -> ApplyResult:
        if digest.node_id == self.node_id:
            return "stale"
        return self.view.apply_digest(digest, now)

    def on_digest_bytes(self, data: bytes, now: float) -> ApplyResult:
        """Decode then apply; raises :class:`~p2pinfer.core.digest.DigestError`."""
        return self.on_digest(decode_digest(data), now)

    def on_load(self, peer_id: str, load: Load, busy: bool, now: float) -> None:
        if peer_id == self.node_id:
            return
        self.view.update_load(peer_id, load, now, self.config.busy_backoff_s if busy else 0.0)

    def on_busy_refusal(self, peer_id: str, now: float) -> None:
        """The target said BUSY: the paper's valve, stay away for a while."""
        self.view.mark_busy(peer_id, now, self.config.busy_backoff_s)

    def on_peer_gone(self, peer_id: str) -> None:
        self.view.remove(peer_id)

    def on_forward_result(self, peer_id: str, predicted: int, realised: int, now: float) -> bool:
        """Compare a forward's predicted reuse with what the peer reports.

        Returns True when this result made the peer distrusted: its cache
        view is dropped and it gets no traffic for ``distrust_s``.
        """
        trust_cfg = self.config.trust
        state = self.view.get(peer_id)
        if state is None or predicted < trust_cfg.min_predicted_tokens:
            return False
        ratio = min(1.0, max(0.0, realised / predicted))
        state.trust = (1 - trust_cfg.smoothing) * state.trust + trust_cfg.smoothing * ratio
        if state.trust < trust_cfg.floor:
            state.distrust_until = now + trust_cfg.distrust_s
            state.trust = 1.0  # a fresh start once the penalty expires
            self.view.forget_cache(peer_id)
            return True
        return False

    def on_wrong_answer(self, peer_id: str, now: float) -> None:
        """A check of the peer's answer failed (:func:`~p2pinfer.core.verify.judge`):
        distrusted at once, as a peer whose cache claims failed, for ``distrust_s``.
        One failed check is enough: an honest peer's tokens pass with a wide margin."""
        state = self.view.get(peer_id)
        if state is not None:
            state.distrust_until = now + self.config.trust.distrust_s
            state.trust = 1.0
        self.view.remove(peer_id)

    # -- what we tell peers ------------------------------------------------------
    def take_delta(self) -> bytes | None:
        delta = self.tracker.take_delta()
        return None if delta is None else encode_digest(delta)

    def full_digest(self) -> bytes:
        return encode_digest(self.tracker.full())
