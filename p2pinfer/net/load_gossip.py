"""A directory node's load reports on its small load topic (:mod:`p2pinfer.core.load_topics`).

Why: in directory mode digests are no longer gossiped, but load reports on
the model's one topic still reach every node, so a node's inbound bytes grow
with the swarm. Here a node that queries the directory publishes its load
report on ``/p2pinfer/load/1/<fingerprint>/<count>/<index>`` instead and
listens on its own load topic only (and, after the count changed, on the
old one for a grace period). The loads of holders outside its topic come
with the directory's answers (:func:`~p2pinfer.core.directory.apply_answer`).

The swarm estimate is the node's own: the larger of its peer view (itself
included) and its KadDHT placement's members. It undercounts peers it has
neither heard of nor met: peers beyond ``max_peers`` that are outside its
load topic and not in its routing table, and gossip-mode peers it is not
connected to. Two nodes whose estimates round to different counts are on
different topics for a while (the count is in the name), never on one
topic that means two things.

Mixed swarms (a known peer does not speak the directory protocol: it
gossips digests and hears load reports on the model topic only): the load
report goes on the model topic instead of the load topic. Every directory
node stays subscribed to the model topic (gossip-mode peers' digests and
loads arrive there), so a report there reaches every node; publishing on
both topics would only double what the node's topic peers receive.

Validation on a load topic is the model topic's (:meth:`GossipService.validate`)
plus ``wrong-topic``: a digest, or a load report of a peer that does not
hash to the topic, is dropped and never relayed.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
import logging
import time
from typing import Any

import trio

from libp2p.peer.id import ID
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub

from ..core.load_topics import LoadTopicMove, LoadTopicState, parse_load_topic

__all__ = ["LoadTopics"]

log = logging.getLogger(__name__)

TICK_S = 1.0
"""How often the swarm estimate is read and the topics brought in line."""
_HEARD_PEERS = 256
"""Peers kept in ``load_reports_heard_by_peer`` (the most recent)."""


class LoadTopics:
    """Subscriptions to this node's load topics, and where its load reports go."""

    def __init__(
        self,
        *,
        pubsub: Pubsub,
        state: LoadTopicState,
        model_topic: str,
        active: Callable[[], bool],
        mixed: Callable[[], bool],
        estimate: Callable[[], int],
        validator: Callable[[int, int], Callable[[ID, rpc_pb2.Message], bool]],
        receive: Callable[[rpc_pb2.Message], None],
        self_id: str,
    ) -> None:
        """``active()``: whether the node queries the directory now (load topics on).
        ``mixed()``: whether a known peer lacks the directory protocol.
        ``validator(count, index)``: the validator of one load topic.
        ``receive(msg)``: what a validated message does (the gossip service's)."""
        self.pubsub = pubsub
        self.state = state
        self.model_topic = model_topic
        self._active = active
        self._mixed = mixed
        self._estimate = estimate
        self._validator = validator
        self._receive = receive
        self._self_id = self_id
        self._nursery: trio.Nursery | None = None
        self.heard = 0
        """Load reports of other peers received on load topics."""
        self.heard_by_peer: OrderedDict[str, int] = OrderedDict()

    def publish_topics(self) -> tuple[str, ...]:
        """Where a load report goes now: the load topic, or the model topic
        (load topics off, none joined yet, or a mixed swarm)."""
        if self.state.current and self._active() and not self._mixed():
            return (self.state.current,)
        return (self.model_topic,)

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await self.tick()
            task_status.started()
            while True:
                await trio.sleep(TICK_S)
                try:
                    await self.tick()
                except Exception:  # a failed (un)subscription is logged; it must not take the node down
                    log.exception("load topic update failed")

    async def tick(self) -> None:
        if self._active():
            move = self.state.update(self._estimate(), time.monotonic())
        elif self.state.current or self.state.leaving:
            move = self.state.reset()
        else:
            return
        await self._apply(move)

    async def _apply(self, move: LoadTopicMove) -> None:
        for topic in move.unsubscribe:
            try:
                await self.pubsub.unsubscribe(topic)  # ends its receive loop
            except Exception as exc:
                log.warning("leaving load topic %s failed: %s", topic, exc)
            self.pubsub.remove_topic_validator(topic)
        for topic in move.subscribe:
            parsed = parse_load_topic(topic)
            assert parsed is not None, topic
            self.pubsub.set_topic_validator(topic, self._validator(parsed[1], parsed[2]), False)
            subscription = await self.pubsub.subscribe(topic)
            assert self._nursery is not None
            self._nursery.start_soon(self._receive_loop, subscription)

    async def _receive_loop(self, subscription: Any) -> None:
        async for msg in subscription:
            try:
                if ID(msg.from_id).to_base58() != self._self_id:
                    self._note_heard(ID(msg.from_id).to_base58())
                self._receive(msg)
            except Exception:  # one bad message must not stop the loop
                log.exception("load topic message handling failed")

    def _note_heard(self, peer: str) -> None:
        self.heard += 1
        self.heard_by_peer[peer] = self.heard_by_peer.pop(peer, 0) + 1
        while len(self.heard_by_peer) > _HEARD_PEERS:
            self.heard_by_peer.popitem(last=False)

    def status(self) -> dict[str, Any]:
        return {
            "load_topic": self.state.current or None,
            "load_topic_count": self.state.count,
            "load_topics_subscribed": list(self.state.subscribed()),
            "load_topic_moves": self.state.moves,
            "load_reports_on": list(self.publish_topics()),
            "load_reports_heard": self.heard,
            "load_reports_heard_by_peer": dict(self.heard_by_peer),
        }
