"""The peer view: what this node believes about every other node.

Everything here is an *estimate* built from gossip: a peer's cache as its
last digest described it, its load as it last reported it, its round-trip
time as last measured. Stale beliefs only cost a cache miss, never a wrong
answer. Time is passed in (seconds on any monotonic clock), never read.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence, Set as AbstractSet
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from sortedcontainers import SortedList

from .digest import Digest

__all__ = ["ApplyResult", "Load", "PeerState", "PeerView", "longest_prefix_holders"]

K = TypeVar("K", bound=Hashable)


def longest_prefix_holders(index: Mapping[int, AbstractSet[K]], block_hashes: Sequence[int]) -> dict[K, int]:
    """Holders of a prefix of ``block_hashes`` in ``index`` (hash -> holders) -> matched blocks.

    Chained hashes make block *i* imply blocks 0..i-1, but a view can be
    inconsistent (a lost delta), so a match stops at the holder's first gap.
    Cost: O(blocks matched x holders still matching).
    """
    matched: dict[K, int] = {}
    alive: set[K] | None = None
    for i, h in enumerate(block_hashes):
        holders = index.get(h)
        if not holders:
            break
        if alive is None:
            alive = set(holders)
        else:
            alive &= holders
            if not alive:
                break
        for holder in alive:
            matched[holder] = i + 1
    return matched

ApplyResult = Literal["applied", "stale", "gap", "fingerprint"]


@dataclass(slots=True)
class Load:
    """A node's self-reported load; also used for the local node."""

    queued_prefill_tokens: int = 0
    """Prompt tokens waiting for (or in) prefill, not yet reused from cache."""
    prefill_ms_per_token: float = 4.0
    """Measured online by the engine."""
    active_requests: int = 0
    slots: int = 1
    """Requests it serves at once (continuous batching); 1 for a peer that does not say."""
    free_slots: int = 1
    """Slots a request arriving now would find free (``slots`` less the
    requests running or waiting for one)."""
    slot_wait_ms: float = 0.0
    """With no slot free: how long until one frees for a request arriving
    now, from the answers being decoded (their ``max_tokens`` left at the
    measured decode speed: an upper bound, answers may end sooner). 0 when
    a slot is free."""
    speed_measured: bool = True
    """False while ``prefill_ms_per_token`` is the engine's calibrated prior,
    not a measurement (a live engine before its first timed prefill): the
    ``cost`` policy then does not compare it with peers' measured speeds
    (see ``policies.local_speed``)."""

    def wait_ms(self) -> float:
        """How long a request arriving now waits before its own prefill: the
        prompts ahead of it (prefills run one chunk at a time, first come
        first served) or a slot to free, whichever is longer; the two
        overlap, since prompts ahead are prefilled while it waits for a slot."""
        return max(self.queued_prefill_tokens * self.prefill_ms_per_token, self.slot_wait_ms)


MAX_REPORTED_SLOTS = 4096
"""Most slots a load report (gossiped or in a directory message) may claim."""
MAX_REPORTED_SLOT_WAIT_MS = 3.6e6
"""Longest wait for a free slot a load report may claim (one hour)."""


@dataclass(slots=True)
class PeerState:
    peer_id: str
    fingerprint: str = ""
    epoch: int | None = None
    """Incarnation of the peer our digest copy belongs to."""
    version: int = 0
    """Digest version we hold; version 0 of an epoch is the empty cache."""
    digest_at: float | None = None
    """When our copy of its digest last changed or was confirmed."""
    hashes: set[int] = field(default_factory=set)
    load: Load = field(default_factory=Load)
    load_at: float | None = None
    busy_until: float = 0.0
    rtt_ms: float | None = None
    last_seen: float = 0.0
    trust: float = 1.0
    """1.0 is fully trusted; lowered when forwards realise less than predicted."""
    distrust_until: float = 0.0

    def digest_age(self, now: float) -> float | None:
        return None if self.digest_at is None else max(0.0, now - self.digest_at)

    def backing_off(self, now: float) -> bool:
        """It said BUSY (a refusal or its load report): we stay away until ``busy_until``."""
        return now < self.busy_until

    def is_distrusted(self, now: float) -> bool:
        return now < self.distrust_until


class PeerView:
    """Peers plus an inverted index from block hash to the peers holding it.

    :meth:`longest_matches` costs O(blocks matched x peers matching), never
    O(peers in the view): a 1,024-peer view answers as fast as a 4-peer one
    when only a few peers hold the prompt's prefix.
    """

    def __init__(self, fingerprint: str, self_id: str = "") -> None:
        self.fingerprint = fingerprint
        self.self_id = self_id
        self._peers: dict[str, PeerState] = {}
        self._index: dict[int, set[str]] = {}
        # (rtt + queue wait in ms, peer id): the cheapest peers for work that
        # no one has cached, found without scanning the whole view.
        self._by_base_cost: SortedList = SortedList()
        self._base_cost: dict[str, float] = {}

    # -- membership ----------------------------------------------------------
    def __contains__(self, peer_id: object) -> bool:
        return peer_id in self._peers

    def __len__(self) -> int:
        return len(self._peers)

    def __iter__(self) -> Iterator[PeerState]:
        return iter(list(self._peers.values()))

    def ids(self) -> list[str]:
        return list(self._peers)

    def get(self, peer_id: str) -> PeerState | None:
        return self._peers.get(peer_id)

    def add(self, peer_id: str, now: float) -> PeerState:
        """Admit ``peer_id`` (or refresh it); never admits this node itself."""
        if peer_id == self.self_id:
            raise ValueError("a node is not its own peer")
        state = self._peers.get(peer_id)
        if state is None:
            state = PeerState(peer_id=peer_id, last_seen=now)
            self._peers[peer_id] = state
            self._reindex_cost(state)
        else:
            state.last_seen = max(state.last_seen, now)
        return state

    def remove(self, peer_id: str) -> bool:
        state = self._peers.pop(peer_id, None)
        if state is None:
            return False
        self._drop_hashes(peer_id, state.hashes)
        old = self._base_cost.pop(peer_id, None)
        if old is not None:
            self._by_base_cost.remove((old, peer_id))
        return True

    def expire(self, now: float, ttl: float) -> list[str]:
        """Remove peers not seen for ``ttl`` seconds; returns their ids."""
        gone = [p.peer_id for p in self._peers.values() if now - p.last_seen > ttl]
        for peer_id in gone:
            self.remove(peer_id)
        return gone

    # -- digests -------------------------------------------------------------
    def _drop_hashes(self, peer_id: str, hashes: Iterable[int]) -> None:
        index = self._index
        for h in hashes:
            holders = index.get(h)
            if holders is not None:
                holders.discard(peer_id)
                if not holders:
                    del index[h]

    def _add_hashes(self, peer_id: str, hashes: Iterable[int]) -> None:
        index = self._index
        for h in hashes:
            holders = index.get(h)
            if holders is None:
                index[h] = {peer_id}
            else:
                holders.add(peer_id)

    def apply_digest(self, digest: Digest, now: float) -> ApplyResult:
        """Fold a digest into the view.

        A message from another model is refused (``"fingerprint"``); an
        older or equal version never overwrites a newer view (``"stale"``);
        a delta whose base is not the version we hold is refused (``"gap"``)
        and the caller should pull a full digest.
        """
        if digest.fingerprint != self.fingerprint:
            return "fingerprint"
        state = self.add(digest.node_id, now)
        state.fingerprint = digest.fingerprint
        if state.epoch != digest.epoch:
            # A new incarnation (restart): what we knew of it is void, and
            # its versions count again from the empty cache at version 0.
            self._drop_hashes(digest.node_id, state.hashes)
            state.hashes = set()
            state.version = 0
            state.epoch = digest.epoch
            state.digest_at = now
        if digest.version <= state.version:
            if digest.version == state.version:
                state.digest_at = now  # confirms our copy is current
            return "stale"
        if digest.kind == "full":
            old = state.hashes
            new = set(digest.added)
            self._drop_hashes(digest.node_id, old - new)
            self._add_hashes(digest.node_id, new - old)
            state.hashes = new
        else:
            if digest.base != state.version:
                return "gap"
            removed = digest.removed & state.hashes
            added = digest.added - state.hashes
            self._drop_hashes(digest.node_id, removed)
            self._add_hashes(digest.node_id, added)
            state.hashes -= removed
            state.hashes |= added
        state.version = digest.version
        state.digest_at = now
        return "applied"

    def forget_cache(self, peer_id: str) -> None:
        """Drop what we believe ``peer_id`` caches (it restarted, or lied)."""
        state = self._peers.get(peer_id)
        if state is None:
            return
        self._drop_hashes(peer_id, state.hashes)
        state.hashes = set()
        state.version = 0
        state.epoch = None  # the next digest, full or delta from 0, starts over
        state.digest_at = None

    # -- load ----------------------------------------------------------------
    def _reindex_cost(self, state: PeerState, default_rtt_ms: float = 5.0) -> None:
        rtt = default_rtt_ms if state.rtt_ms is None else state.rtt_ms
        cost = rtt + state.load.wait_ms()
        old = self._base_cost.get(state.peer_id)
        if old == cost:
            return
        if old is not None:
            self._by_base_cost.remove((old, state.peer_id))
        self._base_cost[state.peer_id] = cost
        self._by_base_cost.add((cost, state.peer_id))

    def cheapest_peers(self, k: int, now: float, exclude: set[str] | frozenset[str] = frozenset()) -> list[PeerState]:
        """Up to ``k`` eligible peers with the lowest RTT + queue wait.

        Skips busy, distrusted and other-model peers as it walks, so the cost
        is O(k + skipped), not O(peers).
        """
        out: list[PeerState] = []
        for _, peer_id in self._by_base_cost:
            if peer_id in exclude:
                continue
            state = self._peers[peer_id]
            if self.eligible(state, now):
                out.append(state)
                if len(out) >= k:
                    break
        return out

    def eligible(self, state: PeerState, now: float) -> bool:
        """May receive work now: same model, not backing off, trusted."""
        return state.fingerprint == self.fingerprint and not state.backing_off(now) and not state.is_distrusted(now)

    def update_load(self, peer_id: str, load: Load, now: float, busy_for: float = 0.0) -> None:
        state = self.add(peer_id, now)
        state.load = load
        state.load_at = now
        self._reindex_cost(state)
        if busy_for > 0:
            state.busy_until = max(state.busy_until, now + busy_for)

    def mark_busy(self, peer_id: str, now: float, backoff_s: float) -> None:
        state = self._peers.get(peer_id)
        if state is not None:
            state.busy_until = max(state.busy_until, now + backoff_s)

    def set_rtt(self, peer_id: str, rtt_ms: float, now: float) -> None:
        state = self.add(peer_id, now)
        # Smooth like TCP's SRTT so one slow sample does not swing routing.
        state.rtt_ms = rtt_ms if state.rtt_ms is None else 0.8 * state.rtt_ms + 0.2 * rtt_ms
        self._reindex_cost(state)

    def reset_rtt(self, peer_id: str) -> None:
        """Forget the smoothed RTT (the path to the peer changed); the next sample starts afresh."""
        state = self._peers.get(peer_id)
        if state is not None and state.rtt_ms is not None:
            state.rtt_ms = None
            self._reindex_cost(state)

    # -- queries -------------------------------------------------------------
    def longest_matches(self, block_hashes: Sequence[int]) -> dict[str, int]:
        """Peers holding a prefix of ``block_hashes`` -> matched blocks."""
        return longest_prefix_holders(self._index, block_hashes)

    def hashes_indexed(self) -> int:
        return len(self._index)
