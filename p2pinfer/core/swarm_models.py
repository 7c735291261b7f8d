"""Which peers serve which model: the swarm's model table.

A swarm may run several models; each keeps its own fingerprint, digests and
routing (one gossip topic per fingerprint). What crosses models is only this
table, fed by small, infrequent model announcements (``net/model_gossip.py``):
per peer, the fingerprint it serves, the model's alias (its file name) and
when it was last heard. An entry node uses it to resolve a request's
``model`` (alias or fingerprint) and to pick the nodes to delegate a request
to when it does not serve that model itself; ``/v1/models`` lists it.

Pure: the clock is passed in.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
import random

__all__ = ["ModelRecord", "SwarmModel", "SwarmModels", "announce_interval_s"]

_REMEMBER_S = 600.0
"""A model no node has announced for this long is forgotten (then: 404, not 503);
never less than two announcement TTLs."""
_MAX_PEERS = 4096
TTL_INTERVALS = 2.5
"""A peer not heard for this many announcement intervals no longer counts as serving."""
FLAT_NODES = 8
"""Up to this many nodes in the table, announcements every base interval."""
MAX_INTERVAL_FACTOR = 10.0


def announce_interval_s(base_s: float, nodes: int) -> float:
    """How often a node announces its model in a swarm of ``nodes`` (as its table counts them).

    Every announcement reaches every node of the swarm, so with a fixed
    interval each node would receive ``nodes / interval`` a second, growing
    with the swarm (at 16 idle nodes the announcements and the IHAVE gossip
    about them were most of a node's pubsub traffic, issue 14). Past
    :data:`FLAT_NODES` the interval grows with the swarm, so a node receives
    about ``FLAT_NODES / base_s`` a second whatever its size, up to
    :data:`MAX_INTERVAL_FACTOR` times the base (80 nodes at the defaults).
    A newcomer still learns every model within a second: each node answers the
    first announcement it hears from a node new to it.
    """
    return base_s * min(MAX_INTERVAL_FACTOR, max(1.0, nodes / FLAT_NODES))


@dataclass(frozen=True, slots=True)
class ModelRecord:
    """What one peer said it serves."""

    peer_id: str
    fingerprint: str
    alias: str
    heard_at: float


@dataclass(frozen=True, slots=True)
class SwarmModel:
    """One model of the swarm, as ``/v1/models`` lists it."""

    fingerprint: str
    alias: str
    nodes: int
    """Nodes serving it now (this node included)."""
    served_here: bool


class SwarmModels:
    """The table of who serves what. ``base_interval_s``: the announcement
    interval of a small swarm (:func:`announce_interval_s` scales it with the
    table); a peer silent for :data:`TTL_INTERVALS` intervals no longer counts."""

    def __init__(
        self, self_id: str, fingerprint: str, alias: str, base_interval_s: float, remember_s: float = _REMEMBER_S
    ) -> None:
        self.self_id = self_id
        self.fingerprint = fingerprint
        self.alias = alias
        self.base_interval_s = base_interval_s
        self._remember_s = remember_s
        self._peers: OrderedDict[str, ModelRecord] = OrderedDict()
        self._busy_until: dict[str, float] = {}
        self._last_alias: dict[str, tuple[str, float]] = {}
        """fingerprint -> (alias, last heard): so a model that lost its nodes is a 503, not a 404."""

    @property
    def interval_s(self) -> float:
        """This node's announcement interval now (the table counts the swarm, this node included)."""
        return announce_interval_s(self.base_interval_s, len(self._peers) + 1)

    @property
    def ttl_s(self) -> float:
        return TTL_INTERVALS * self.interval_s

    @property
    def remember_s(self) -> float:
        return max(self._remember_s, 2 * self.ttl_s)

    def heard(self, peer_id: str, fingerprint: str, alias: str, now: float) -> bool:
        """A peer announced its model; True when the peer or its model is new to us."""
        if peer_id == self.self_id:
            return False
        old = self._peers.pop(peer_id, None)
        self._peers[peer_id] = ModelRecord(peer_id, fingerprint, alias, now)
        self._last_alias[fingerprint] = (alias, now)
        while len(self._peers) > _MAX_PEERS:
            self._peers.popitem(last=False)
        return old is None or old.fingerprint != fingerprint or now - old.heard_at > self.ttl_s

    def forget(self, peer_id: str) -> None:
        """The peer is gone, or its engine refused the fingerprint it announced."""
        self._peers.pop(peer_id, None)
        self._busy_until.pop(peer_id, None)

    def mark_busy(self, peer_id: str, now: float, backoff_s: float) -> None:
        """It answered a delegated request BUSY: stay away for ``backoff_s``."""
        self._busy_until[peer_id] = now + backoff_s

    def delegates(self, fingerprint: str, now: float, rng: random.Random, limit: int) -> list[str]:
        """The nodes to try, in order, for a request for a model this node does not serve.

        This node holds no digests of that model (they are on its own topic),
        so the choice is at random among its live nodes, those that said BUSY
        lately last; the chosen node tokenises the request and routes it by
        prefix among its model's nodes, as if it had entered there.
        """
        peers = self.serving(fingerprint, now)
        rng.shuffle(peers)
        peers.sort(key=lambda p: self._busy_until.get(p, 0.0) > now)
        for p in [p for p, t in self._busy_until.items() if t <= now]:
            del self._busy_until[p]
        return peers[:limit]

    def _alive(self, record: ModelRecord, now: float) -> bool:
        return now - record.heard_at <= self.ttl_s

    def serving(self, fingerprint: str, now: float) -> list[str]:
        """Peers (not this node) that serve ``fingerprint`` now, most recently heard first."""
        return [r.peer_id for r in reversed(self._peers.values()) if r.fingerprint == fingerprint and self._alive(r, now)]

    def model_of(self, peer_id: str, now: float) -> str | None:
        record = self._peers.get(peer_id)
        return record.fingerprint if record is not None and self._alive(record, now) else None

    def resolve(self, name: str, now: float) -> str | None:
        """The fingerprint a request's ``model`` names (alias or fingerprint), or ``None``.

        This node's own model wins a tie of aliases; then the model with the
        most nodes now. A model heard of within ``remember_s`` still resolves
        (its request gets a 503 while no node serves it, not a 404).
        """
        if name in (self.fingerprint, self.alias):
            return self.fingerprint
        self._expire(now)
        if name in self._last_alias:
            return name
        matches = [fp for fp, (alias, _) in self._last_alias.items() if alias == name]
        if not matches:
            return None
        return max(matches, key=lambda fp: (len(self.serving(fp, now)), fp))

    def alias_of(self, fingerprint: str) -> str:
        if fingerprint == self.fingerprint:
            return self.alias
        return self._last_alias.get(fingerprint, (fingerprint, 0.0))[0]

    def models(self, now: float) -> list[SwarmModel]:
        """Every model served now, this node's first, then by node count."""
        self._expire(now)
        counts: dict[str, int] = {self.fingerprint: 1}
        for record in self._peers.values():
            if self._alive(record, now):
                counts[record.fingerprint] = counts.get(record.fingerprint, 0) + 1
        out = [
            SwarmModel(fp, self.alias_of(fp), n, fp == self.fingerprint)
            for fp, n in counts.items()
        ]
        out.sort(key=lambda m: (not m.served_here, -m.nodes, m.alias, m.fingerprint))
        return out

    def _expire(self, now: float) -> None:
        for peer in [p for p, r in self._peers.items() if now - r.heard_at > self.remember_s]:
            del self._peers[peer]
        for fp in [fp for fp, (_, t) in self._last_alias.items() if now - t > self.remember_s]:
            del self._last_alias[fp]

    def as_dict(self, now: float) -> list[dict[str, object]]:
        return [
            {"id": m.alias, "fingerprint": m.fingerprint, "nodes": m.nodes, "served_here": m.served_here}
            for m in self.models(now)
        ]
