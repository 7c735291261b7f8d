"""The simulator's load topics as the live node makes them (``--load-topics hash``).

A mixin of :class:`~p2pinfer.sim.simulator.Simulator`. With directory
discovery a node's load reports go on topic ``sha256(id) mod count`` of
``count`` topics, ``count`` the power of two nearest to ``swarm /
nodes_per_topic`` (:mod:`p2pinfer.core.load_topics`, the live node's own
functions). The swarm's size is the simulator's one membership: the
initial nodes take the configured size, a joining node the live swarm with
itself, and every node recomputes the count at each of its load ticks and
moves when it changed (at once: the live node's grace period on the old
topic is not modelled). A live node's estimate is its own view, which can
be smaller (see :mod:`p2pinfer.net.load_gossip`).

Topic sizes vary (binomially, mean ``nodes_per_topic``), unlike ``fill``'s
topics of exactly ``topic_nodes()``; each gossip copy's envelope is charged
with what the load topic's name adds to the digest topic's (3 to 9 bytes).
"""

from __future__ import annotations

from typing import Any

from ..core.load_topics import digest_topic, load_topic_name, topic_count, topic_index
from .model import DIRECTORY_NEIGHBOURHOOD, SimConfig, SimNode

__all__ = ["HashedTopics"]


class HashedTopics:
    """Hashed load topics for the simulator (see the module docstring)."""

    config: SimConfig
    topics: list[list[SimNode]]
    alive: list[SimNode]
    now: float
    fingerprint_hex: str

    def _init_hashed_topics(self) -> None:
        self.topic_keys: dict[tuple[int, int], int] = {}
        """(count, index) -> the topic's place in ``topics``."""
        self.topic_extra_bytes: dict[int, int] = {}
        """Topic place -> bytes its name adds to a gossip envelope over the digest topic's."""
        self.load_topic_moves = 0

    def nodes_per_topic(self) -> int:
        return self.config.topic_size or DIRECTORY_NEIGHBOURHOOD

    def _hashed_topic(self, node_id: str, swarm: int) -> tuple[int, int]:
        """``(count, topic place)`` of ``node_id`` in a swarm of ``swarm`` nodes."""
        count = topic_count(swarm, self.nodes_per_topic())
        key = (count, topic_index(node_id, count))
        place = self.topic_keys.get(key)
        if place is None:
            place = len(self.topics)
            self.topics.append([])
            self.topic_keys[key] = place
            # Over the digest topic of the same fingerprint, whose envelope cfg.envelope_bytes is.
            self.topic_extra_bytes[place] = len(load_topic_name(self.fingerprint_hex, *key)) - len(digest_topic(self.fingerprint_hex))
        return count, place

    def _retopic(self, node: SimNode) -> None:
        """At a load tick: move ``node`` if the swarm's size changed its count."""
        count, place = self._hashed_topic(node.id, len(self.alive))
        if count == node.topic_count:
            return
        self.topics[node.topic].remove(node)
        self.topics[place].append(node)
        node.topic, node.topic_count = place, count
        self.load_topic_moves += 1

    def hashed_topics_summary(self) -> dict[str, Any]:
        """What the result says about the topics: counts in use, sizes, moves."""
        counts = sorted({n.topic_count for n in self.alive})
        sizes = [len(self.topics[place]) for (count, _), place in self.topic_keys.items() if count == counts[-1]]
        sizes = [s for s in sizes if s]
        return {
            "scheme": "hash",
            "nodes_per_topic": self.nodes_per_topic(),
            "counts_at_end": counts,
            "topic_sizes_at_end": {"min": min(sizes), "mean": round(sum(sizes) / len(sizes), 2), "max": max(sizes)},
            "moves": self.load_topic_moves,
        }
