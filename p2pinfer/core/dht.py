"""What py-libp2p's KadDHT does on its own, as rules both the live node and the simulator run.

The live node places anchors with py-libp2p's ``KadDHT``
(:class:`~p2pinfer.net.directory.DhtPlacement`); the DHT costs bytes of its
own, which the simulator must count. The rules here are the ones that
decide *when* the DHT talks:

* :func:`routing_table_complete`: the live placement trusts its routing
  table while no bucket is full, and looks anchors up in the DHT once one
  is (``DhtPlacement.resolve``);
* :class:`ResolveSchedule`: which anchors such a lookup is due for (first
  use, then again after :data:`RESOLVE_TTL_S`);
* :func:`kbucket_sizes`: the bucket sizes py-libp2p's ``RoutingTable``
  ends with for a set of peers (it splits *any* full bucket at the middle
  of its key range, up to 256 buckets, so a bucket is split exactly when
  more than ``BUCKET_SIZE`` peers fall in its range, whatever the order
  they came in); the simulator's nodes use it, the live node reads its real
  table;
* :func:`refresh_lookups` and :func:`lookup_queries`: what one routing-table
  refresh and one lookup (``find_closest_peers_network``) cost in lookups and
  FIND_NODE requests.

The constants are py-libp2p's (``libp2p.kad_dht.common``,
``kad_dht.ROUTING_TABLE_REFRESH_INTERVAL``); tests/net/test_directory_units.py
checks them against the installed library, and :func:`kbucket_sizes`
against its ``RoutingTable``.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence

__all__ = [
    "ALPHA",
    "BUCKET_SIZE",
    "KEY_SPACE",
    "MAX_BUCKETS",
    "RESOLVE_TTL_S",
    "ROUTING_TABLE_REFRESH_S",
    "ResolveSchedule",
    "kbucket_sizes",
    "lookup_queries",
    "refresh_lookups",
    "routing_table_complete",
]

BUCKET_SIZE = 20
"""k: peers per bucket, and peers per FIND_NODE answer (``libp2p.kad_dht.common.BUCKET_SIZE``)."""
ALPHA = 10
"""FIND_NODE requests per lookup round (``libp2p.kad_dht.common.ALPHA``)."""
MAX_BUCKETS = 256
"""``libp2p.kad_dht.common.MAXIMUM_BUCKETS``."""
KEY_SPACE = 1 << 256
"""Routing-table keys: SHA-256 of the peer id (``routing_table.peer_id_to_key``)."""
ROUTING_TABLE_REFRESH_S = 600.0
"""KadDHT's maintenance loop refreshes the routing table when it starts and then every 600 s
(``libp2p.kad_dht.kad_dht.ROUTING_TABLE_REFRESH_INTERVAL``)."""
RESOLVE_TTL_S = 300.0
"""An anchor looked up in the DHT is looked up again after this long (joins far away)."""


def routing_table_complete(bucket_sizes: Iterable[int], bucket_size: int = BUCKET_SIZE) -> bool:
    """No bucket full: the placement takes the routing table as every DHT peer there is."""
    return all(size < bucket_size for size in bucket_sizes)


def kbucket_sizes(keys: Sequence[int], exclude: int | None = None, bucket_size: int = BUCKET_SIZE) -> list[int]:
    """Sizes of py-libp2p's routing-table buckets holding ``keys`` (sorted ints in
    ``[0, KEY_SPACE)``), less ``exclude`` (the table's own key), lowest range first.

    py-libp2p splits a full bucket at its range's midpoint whenever a peer
    that falls in it arrives (any bucket, up to :data:`MAX_BUCKETS`), so a
    range ends split exactly when more than ``bucket_size`` peers fall in it.
    """
    if exclude is not None:
        i = bisect_left(keys, exclude)
        if i == len(keys) or keys[i] != exclude:
            exclude = None
    out: list[int] = []
    stack = [(0, KEY_SPACE)]
    while stack:
        lo, hi = stack.pop()
        n = bisect_left(keys, hi) - bisect_left(keys, lo)
        if exclude is not None and lo <= exclude < hi:
            n -= 1
        if n > bucket_size and len(out) + len(stack) + 2 <= MAX_BUCKETS and hi - lo > 1:
            mid = (lo + hi) // 2
            stack.append((mid, hi))
            stack.append((lo, mid))
        else:
            out.append(n)
    return out


def refresh_lookups(bucket_sizes: Iterable[int]) -> int:
    """Lookups of one routing-table refresh (``PeerRouting.refresh_routing_table``):
    one for the node's own id, one for a random key in every non-empty bucket."""
    return 1 + sum(1 for size in bucket_sizes if size > 0)


def lookup_queries(table_peers: int) -> int:
    """FIND_NODE requests of one ``find_closest_peers_network`` when the tables it
    meets are complete: one round of ``ALPHA`` requests to the closest peers,
    whose answers name no closer peer, which ends the lookup. Incomplete tables
    take more rounds (at most 20): this is the floor."""
    return min(ALPHA, max(0, table_peers))


class ResolveSchedule:
    """Which anchors a DHT lookup is due for: those never looked up, and those
    looked up :data:`RESOLVE_TTL_S` ago or more (only while the routing table
    is incomplete; see :func:`routing_table_complete`)."""

    def __init__(self, ttl_s: float = RESOLVE_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._resolved: dict[int, float] = {}

    def __contains__(self, anchor: object) -> bool:
        return anchor in self._resolved

    def due(self, anchors: Iterable[int], now: float, complete: bool) -> list[int]:
        """The anchors to look up now, each marked as looked up at ``now``."""
        if complete:
            return []
        todo = [a for a in dict.fromkeys(anchors) if now - self._resolved.get(a, now - self.ttl_s) >= self.ttl_s]
        for a in todo:
            self._resolved[a] = now
        return todo

    def mark(self, anchor: int, when: float) -> None:
        """Record a lookup of ``anchor`` made at ``when``."""
        self._resolved[anchor] = when
