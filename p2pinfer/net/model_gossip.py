"""The swarm's model announcements: one gossipsub topic shared by every model.

Each node says which model it serves (fingerprint, alias, addresses) on
``/p2pinfer/models/1``: at start, every ``GossipConfig.model_interval_s``
(jittered; longer in a swarm of more than eight nodes,
:func:`~p2pinfer.core.swarm_models.announce_interval_s`), and once soon after it first hears a node (so that a newcomer
learns every model within about a second, without anyone chattering every
second). Announcements feed :class:`~p2pinfer.core.swarm_models.SwarmModels`
and membership (the addresses to dial); digests and load reports stay on
each model's own topic.

The validator drops malformed, oversized, spoofed and over-rate messages
(and everything from a distrusted peer) before gossipsub relays them.
"""

from __future__ import annotations

from collections.abc import Callable
import logging
import random
import time
from typing import Any

import trio

from libp2p.peer.id import ID
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub

from .origin_rate import OriginRateLimit
from ..core.swarm_models import SwarmModels
from .counters import NodeCounters
from .sanctions import PeerSanctions
from .wire import GossipRejected, decode_model_announcement, encode_model_announcement

__all__ = ["MODELS_TOPIC", "ModelGossip"]

log = logging.getLogger(__name__)

MODELS_TOPIC = "/p2pinfer/models/1"
_MAX_PER_ORIGIN_PER_S = 5
_ANSWER_DELAY_S = (0.2, 0.6)
"""A node that hears a newcomer announces itself after this (random) delay, once per burst."""


class ModelGossip:
    def __init__(
        self,
        *,
        pubsub: Pubsub,
        models: SwarmModels,
        counters: NodeCounters,
        self_id: str,
        addrs: Callable[[], list[str]],
        on_heard: Callable[[str, tuple[str, ...]], None],
        sanctions: PeerSanctions | None = None,
    ) -> None:
        self.pubsub = pubsub
        self.models = models
        self.counters = counters
        self.self_id = self_id
        self._addrs = addrs
        self._on_heard = on_heard
        self._sanctions = sanctions
        self._rates = OriginRateLimit(_MAX_PER_ORIGIN_PER_S)
        self._answer = trio.Event()
        self.published = 0

    def validate(self, forwarder: ID, msg: rpc_pb2.Message) -> bool:
        try:
            sender = ID(msg.from_id).to_base58()
        except Exception:
            self.counters.gossip_rejected["malformed"] += 1
            return False
        if sender == self.self_id:
            return True
        try:
            if self._sanctions is not None and self._sanctions.is_distrusted(sender):
                raise GossipRejected("distrusted")
            if not self._rates.allow(sender):
                raise GossipRejected("rate")
            decode_model_announcement(msg.data, sender=sender)
        except GossipRejected as exc:
            self.counters.gossip_rejected[exc.reason] += 1
            return False
        return True

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        self.pubsub.set_topic_validator(MODELS_TOPIC, self.validate, False)
        subscription = await self.pubsub.subscribe(MODELS_TOPIC)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._receive_loop, subscription)
            await self.announce()
            nursery.start_soon(self._announce_loop)
            task_status.started()

    async def announce(self) -> None:
        payload = encode_model_announcement(self.self_id, self.models.fingerprint, self.models.alias, self._addrs())
        try:
            await self.pubsub.publish(MODELS_TOPIC, payload)
            self.published += 1
        except Exception as exc:  # a publish must never take the node down
            log.warning("model announcement failed: %s", exc)

    async def _announce_loop(self) -> None:
        while True:
            with trio.move_on_after(self.models.interval_s * random.uniform(0.9, 1.1)):
                await self._answer.wait()
                # A newcomer: let the burst of announcements settle, then answer once.
                await trio.sleep(random.uniform(*_ANSWER_DELAY_S))
            self._answer = trio.Event()
            await self.announce()

    async def _receive_loop(self, subscription: Any) -> None:
        async for msg in subscription:
            try:
                sender = ID(msg.from_id).to_base58()
                if sender == self.self_id:
                    continue
                ann = decode_model_announcement(msg.data, sender=sender)
            except (GossipRejected, Exception):  # validated already; a stale cache entry is dropped
                continue
            if self.models.heard(sender, ann.fingerprint, ann.alias, time.monotonic()):
                self._answer.set()
            self._on_heard(sender, ann.addrs)
