"""The ``oracle`` policy: ``cost``'s rule with perfect, instantaneous knowledge.

It is what a central router that sees every cache and every queue exactly
would decide, and the limit we measure the gossip-fed ``cost`` policy
against. It exists only in the simulator (no real node can know this).

It runs the *same* :class:`~p2pinfer.core.policies.CostPolicy` code; only
the view changes: :class:`OracleView` answers the questions the policy asks
a :class:`~p2pinfer.core.peers.PeerView` from ground truth at decision time:

* a peer's match is read from an exact index of the block hashes every
  live node's digest lists (kept from the digest trackers' own listing
  changes), at block granularity, which is what a perfectly fresh digest
  says;
* a peer's load is its exact current :class:`~p2pinfer.core.peers.Load`;
* RTTs are the true link delays;
* a peer is eligible when it is alive and would not refuse the request
  (not over the busy threshold right now); it knows nothing of trust or
  backoffs because it never needs them.

With zero latency and instantaneous lossless gossip the view a ``cost``
node holds equals this one, so the two policies take the same decisions
(tests/sim/test_oracle.py checks it decision for decision).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
import heapq
import random
from typing import Protocol

from ..core.digest import DigestTracker
from ..core.peers import PeerState, longest_prefix_holders
from ..core.policies import CostPolicy, Decision, LocalState, RouteRequest
from .model import SimNode

__all__ = ["OracleIndex", "OraclePolicy", "OracleView", "OracleWorld"]


class OracleWorld(Protocol):
    """The ground truth the oracle reads: the :class:`~p2pinfer.sim.simulator.Simulator`."""

    fingerprint_hex: str
    nodes: list[SimNode]
    by_id: dict[str, SimNode]
    oracle_index: OracleIndex | None

    def rtt_ms(self, a: SimNode, b: SimNode) -> float: ...

    def live_nodes(self) -> list[SimNode]: ...


class OracleIndex:
    """Block hash -> indices of the live nodes whose digest lists it now:
    cached, or in a prompt the node is serving (see
    :class:`~p2pinfer.core.digest.DigestTracker`), exact and without delay.

    It follows each node's tracker rather than its cache, so the oracle
    knows exactly what a perfectly fresh digest would say and hashes
    nothing itself."""

    def __init__(self) -> None:
        self.holders: dict[int, set[int]] = {}
        self._held: dict[int, set[int]] = {}
        self._listeners: dict[int, tuple[DigestTracker, Callable[[int, bool], None]]] = {}

    def attach(self, node: int, tracker: DigestTracker) -> None:
        held: set[int] = set()
        self._held[node] = held
        holders = self.holders

        def on_listing(h: int, listed: bool) -> None:
            if listed:
                held.add(h)
                holders.setdefault(h, set()).add(node)
            else:
                held.discard(h)
                s = holders[h]
                s.discard(node)
                if not s:
                    del holders[h]

        for h in tracker.hashes:
            on_listing(h, True)
        tracker.subscribe(on_listing)
        self._listeners[node] = (tracker, on_listing)

    def detach(self, node: int) -> None:
        tracker, listener = self._listeners.pop(node)
        tracker.unsubscribe(listener)
        for h in self._held.pop(node):
            s = self.holders[h]
            s.discard(node)
            if not s:
                del self.holders[h]

    def held(self, node: int) -> frozenset[int]:
        return frozenset(self._held.get(node, ()))


class OracleView:
    """Ground truth, shaped like the parts of PeerView a policy reads."""

    def __init__(self, sim: OracleWorld, decider: SimNode, now: float) -> None:
        self.sim = sim
        self.decider = decider
        self.now = now

    def _state(self, node: SimNode) -> PeerState:
        sim = self.sim
        return PeerState(
            peer_id=node.id,
            fingerprint=sim.fingerprint_hex,
            version=1,
            digest_at=self.now,
            load=node.load(),
            load_at=self.now,
            rtt_ms=sim.rtt_ms(self.decider, node),
            last_seen=self.now,
        )

    def longest_matches(self, block_hashes: Sequence[int]) -> dict[str, int]:
        matched = longest_prefix_holders(self.sim.oracle_index.holders, block_hashes)  # type: ignore[union-attr]
        matched.pop(self.decider.idx, None)
        nodes = self.sim.nodes
        return {nodes[n].id: blocks for n, blocks in matched.items()}

    def get(self, peer_id: str) -> PeerState | None:
        node = self.sim.by_id.get(peer_id)
        if node is None or not node.alive or node is self.decider:
            return None
        return self._state(node)

    def eligible(self, state: PeerState, now: float) -> bool:
        node = self.sim.by_id.get(state.peer_id)
        return node is not None and node.alive and not node.is_busy()

    def cheapest_peers(
        self, k: int, now: float, exclude: set[str] | frozenset[str] | object = frozenset()
    ) -> list[PeerState]:
        sim = self.sim
        excluded = exclude if isinstance(exclude, (set, frozenset)) else set(exclude)  # dict keys
        keyed: list[tuple[float, str, SimNode]] = []
        for node in sim.live_nodes():
            if node is self.decider or node.id in excluded or node.is_busy():
                continue
            load = node.load()
            cost = sim.rtt_ms(self.decider, node) + load.queued_prefill_tokens * load.prefill_ms_per_token
            keyed.append((cost, node.id, node))
        return [self._state(n) for _, _, n in heapq.nsmallest(k, keyed, key=lambda t: (t[0], t[1]))]

    def __iter__(self) -> Iterator[PeerState]:
        return iter([self._state(n) for n in self.sim.live_nodes() if n is not self.decider])

    def __len__(self) -> int:
        return sum(1 for n in self.sim.live_nodes() if n is not self.decider)


class OraclePolicy:
    """``cost``'s decision rule (the very same object) over :class:`OracleView`."""

    name = "oracle"

    def __init__(self, sim: OracleWorld, node: SimNode, rule: CostPolicy | None = None) -> None:
        self.sim = sim
        self.node = node
        self.rule = rule or CostPolicy()
        self.rule.name = "oracle"

    def decide(
        self, request: RouteRequest, local: LocalState, view: object, now: float, rng: random.Random
    ) -> Decision:
        return self.rule.decide(request, local, OracleView(self.sim, self.node, now), now, rng)  # type: ignore[arg-type]

