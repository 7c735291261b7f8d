"""Load reports in small topics: which topic a node's load report goes to.

Why: with the prefix directory a node no longer needs every peer's digest,
but on one topic per model every node still receives every peer's load
report, so its inbound bytes grow with the swarm. Split into topics of about
``nodes_per_topic`` nodes, a node hears a constant number of load reports
whatever the swarm's size; the loads of peers outside its topic that it
needs (the holders of a prompt's prefix) come with the directory's answer
(:func:`~p2pinfer.core.directory.apply_answer`).

The rules are pure so that the live node (:mod:`p2pinfer.net.load_gossip`)
and the simulator (``--load-topics hash``) run the same ones:

* the number of topics is the power of two nearest (in ratio) to
  ``swarm_estimate / nodes_per_topic``, at least 1: a power of two so that
  a topic of ``count`` splits into exactly two of ``2 * count`` when the
  swarm doubles, and nearest in ratio so that each topic holds between
  ``nodes_per_topic / sqrt 2`` and ``nodes_per_topic * sqrt 2`` on average;
* a node's topic is ``sha256(peer id bytes) mod count``: any node computes
  any peer's topic (which is how a receiver checks that a report is on the
  right topic) and nobody chooses their own;
* the name is ``/p2pinfer/load/1/<model fingerprint>/<count>/<index>``: the
  count is in the name, so nodes that disagree on it for a while (their
  swarm estimates differ) are on different topics, not on one topic that
  means two things.

:class:`LoadTopicState` is what a node does when its estimate moves the
count: it subscribes to the new topic at once and keeps the old one for a
grace period, so reports of peers that have not moved yet still reach it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import hashlib

import base58

__all__ = [
    "LOAD_TOPIC_PREFIX",
    "LoadTopicState",
    "LoadTopicMove",
    "digest_topic",
    "load_topic_name",
    "parse_load_topic",
    "peer_id_bytes",
    "topic_count",
    "topic_index",
    "topic_of",
]

LOAD_TOPIC_PREFIX = "/p2pinfer/load/1/"
"""Every load topic's name starts so (the wire version is the ``1``)."""
_MAX_COUNT = 1 << 20
"""No swarm is this big; a name claiming more topics is not ours."""


def digest_topic(fingerprint_hex: str) -> str:
    """The model's digest topic (every node of the model subscribes to it):
    one topic per fingerprint, so other models never hear us."""
    return f"/p2pinfer/digest/1/{fingerprint_hex}"


def topic_count(swarm_estimate: int, nodes_per_topic: int) -> int:
    """The power of two nearest (in ratio) to ``swarm_estimate / nodes_per_topic``, at least 1.

    Exact in integers: ``2**k`` is chosen over ``2**(k+1)`` while the ratio
    is below ``2**k * sqrt 2``, i.e. while ``ratio**2 < 2**(2k+1)``."""
    if nodes_per_topic < 1:
        raise ValueError("nodes_per_topic must be at least 1")
    if swarm_estimate <= nodes_per_topic:
        return 1
    count = 1
    # ratio = e / n; move up while ratio >= count * sqrt(2), i.e. e**2 >= 2 * (count * n)**2
    while swarm_estimate * swarm_estimate >= 2 * (count * nodes_per_topic) ** 2 and count < _MAX_COUNT:
        count *= 2
    return count


def peer_id_bytes(peer_id: str) -> bytes:
    """A peer id's bytes (base58-decoded, as libp2p's ``ID.to_bytes()``);
    an id that is not base58 (a test's name) by its UTF-8 bytes."""
    try:
        return base58.b58decode(peer_id)
    except ValueError:
        return peer_id.encode()


def topic_index(peer_id: str, count: int) -> int:
    """``sha256(peer id bytes) mod count``: the peer's topic among ``count``."""
    if count < 1:
        raise ValueError("count must be at least 1")
    return int.from_bytes(hashlib.sha256(peer_id_bytes(peer_id)).digest(), "big") % count


def load_topic_name(fingerprint_hex: str, count: int, index: int) -> str:
    if not 0 <= index < count:
        raise ValueError(f"topic index {index} out of 0..{count - 1}")
    return f"{LOAD_TOPIC_PREFIX}{fingerprint_hex}/{count}/{index}"


def topic_of(peer_id: str, fingerprint_hex: str, count: int) -> str:
    """The name of ``peer_id``'s load topic among ``count``."""
    return load_topic_name(fingerprint_hex, count, topic_index(peer_id, count))


def parse_load_topic(name: str) -> tuple[str, int, int] | None:
    """``(fingerprint, count, index)`` of a load topic's name; ``None`` if it
    is not one (wrong prefix, a count that is not a power of two, an index
    out of range): what a node accepts a subscription to."""
    if not name.startswith(LOAD_TOPIC_PREFIX):
        return None
    parts = name[len(LOAD_TOPIC_PREFIX):].split("/")
    if len(parts) != 3 or not all(p.isdigit() and p.isascii() for p in parts[1:]):
        return None
    fingerprint, count, index = parts[0], int(parts[1]), int(parts[2])
    if not fingerprint or count < 1 or count > _MAX_COUNT or count & (count - 1) or index >= count:
        return None
    if parts[1] != str(count) or parts[2] != str(index):  # no leading zeros: one name per topic
        return None
    return fingerprint, count, index


@dataclass(frozen=True)
class LoadTopicMove:
    """What a node does after :meth:`LoadTopicState.update`: topics to join and to leave."""

    subscribe: tuple[str, ...] = ()
    unsubscribe: tuple[str, ...] = ()


@dataclass
class LoadTopicState:
    """One node's load topics: the current one, and the one it is leaving.

    ``update`` with the node's swarm estimate: when the count changes the
    node publishes on the new topic at once, and stays subscribed to the
    old one for ``grace_s`` so that the reports of peers that still use the
    old count (their estimate moves later) reach it; after that it leaves.
    """

    peer_id: str
    fingerprint_hex: str
    nodes_per_topic: int
    grace_s: float
    count: int = 0
    """0 before the first update."""
    current: str = ""
    leaving: dict[str, float] = field(default_factory=dict)
    """Old topic -> when the node leaves it."""
    moves: int = 0
    """Count changes after the first topic (``load_topic_moves`` in /status)."""

    def update(self, swarm_estimate: int, now: float) -> LoadTopicMove:
        count = topic_count(swarm_estimate, self.nodes_per_topic)
        subscribe: list[str] = []
        unsubscribe = [t for t, until in self.leaving.items() if until <= now]
        for topic in unsubscribe:
            del self.leaving[topic]
        if count != self.count:
            new = topic_of(self.peer_id, self.fingerprint_hex, count)
            if self.current:
                self.moves += 1
                self.leaving[self.current] = now + self.grace_s
            self.count, self.current = count, new
            if new in self.leaving:  # back to a topic it was leaving: stay
                del self.leaving[new]
            else:
                subscribe.append(new)
        return LoadTopicMove(tuple(subscribe), tuple(unsubscribe))

    def subscribed(self) -> tuple[str, ...]:
        """Every topic the node listens on now (the current one first)."""
        return ((self.current,) if self.current else ()) + tuple(self.leaving)

    def reset(self) -> LoadTopicMove:
        """Leave every load topic (the node went back to gossiping digests)."""
        gone = self.subscribed()
        self.count, self.current = 0, ""
        self.leaving.clear()
        return LoadTopicMove((), gone)
