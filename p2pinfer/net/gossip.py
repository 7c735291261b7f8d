"""Digest and load gossip over one gossipsub topic per model fingerprint.

Anti-entropy in three layers, all driven by :class:`~p2pinfer.core.router.Router`
on the schedule of :class:`~p2pinfer.core.router.AnnounceSchedule` (which the
simulator runs too):

* deltas: cache changes are batched and published at most every
  ``delta_interval_s`` (the first change after a quiet spell goes out at the
  next 50 ms poll, so an idle swarm hears of it quickly);
* full digests every ``full_interval_s`` (with jitter), only when the digest
  changed since the last one, heal lost deltas;
* load reports, at once when the busy flag flips (the hotspot valve), every
  ``load_interval_s`` while the node has work or its load changed, and every
  ``keepalive_interval_s`` when it is idle and some peer in its view is not
  directly connected to it, double as liveness and membership: they carry
  the addresses to dial and the digest version, so a peer that fell behind
  pulls a full digest instead of waiting.

An idle node with a peer it is not directly connected to therefore publishes
one small message per keep-alive interval, and each peer receives it from
each of its gossipsub mesh neighbours: that, not the busy schedule, is what
a node costs its peers when nothing happens. Where every peer is directly
connected (a swarm within ``max_peers``), an idle node publishes nothing:
each connected peer's membership probes it instead when it has been silent
for ``peer_ttl_s - keepalive_interval_s``.

The validator runs before gossipsub relays anything: malformed, oversized,
other-model, spoofed (payload names another node than the signer) and
over-rate messages are dropped and counted, never relayed; so is everything
from a peer we distrust (:mod:`.sanctions`) or found to run another model
(:mod:`.other_models`). A malformed, spoofed or oversized message that
comes straight from its signer also lowers the signer's gossipsub score.

In directory mode the load reports go on a small load topic instead
(:mod:`.load_gossip`); this service validates and receives those too
(:meth:`GossipService.load_topic_validator`): a digest there, or a report
of a peer that does not hash to the topic, is rejected as ``wrong-topic``.
"""

from __future__ import annotations

from collections import OrderedDict
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
from ..core.digest import Digest, encode_digest
from ..core.load_topics import topic_index
from ..core.router import AnnounceSchedule, Router
from ..engines.base import Engine
from .counters import NodeCounters
from .other_models import OtherModels
from .sanctions import PeerSanctions
from .wakeup import Wakeup
from .wire import GOSSIP_MAX_BYTES, GossipRejected, LoadInfo, decode_gossip, encode_gossip_digest, encode_gossip_load, load_to_pb

__all__ = ["GossipService"]

log = logging.getLogger(__name__)

_POLL_S = 0.05
_MAX_MSGS_PER_ORIGIN_PER_S = 50
_DECODED_CACHE = 1024
_DIGESTS_OFF_POLL_S = 1.0
"""With digests off, how often the delta loop checks whether they are back on."""
_ATTRIBUTABLE = frozenset({"malformed", "spoofed", "oversized", "wrong-topic"})
"""Rejections no honest node's message can earn (unlike "rate" or "version")."""


class GossipService:
    def __init__(
        self,
        *,
        pubsub: Pubsub,
        topic: str,
        router: Router,
        engine: Engine,
        counters: NodeCounters,
        self_id: str,
        addrs: Callable[[], list[str]],
        is_busy: Callable[[], bool],
        on_heard: Callable[[str, tuple[str, ...]], None],
        want_pull: Callable[[str, int, int], None],
        sanctions: PeerSanctions | None = None,
        other_models: OtherModels | None = None,
        publish_digests: Callable[[], bool] = lambda: True,
        nat_facts: Callable[[], dict[str, Any]] | None = None,
        on_load: Callable[[str, LoadInfo], None] | None = None,
        keepalive_wanted: Callable[[], bool] = lambda: True,
        load_topics: Callable[[], tuple[str, ...]] | None = None,
    ) -> None:
        """``publish_digests()``: whether digests go out now (``False`` while
        the node finds caches through the prefix directory; its load reports
        still go out). ``keepalive_wanted()``: whether an idle node repeats
        its load report every ``keepalive_interval_s`` (``False`` while every
        peer in the view is directly connected: their probes keep us in
        their views, :meth:`.membership.Membership.keepalive_wanted`).
        ``load_topics()``: where load reports go now (default: the model
        topic; :meth:`.load_gossip.LoadTopics.publish_topics`)."""
        self.pubsub = pubsub
        self.publish_digests = publish_digests
        self._digests_were_on = True
        self.topic = topic
        self.router = router
        self.engine = engine
        self.counters = counters
        self.self_id = self_id
        self._addrs = addrs
        self._is_busy = is_busy
        self._on_heard = on_heard
        self._want_pull = want_pull
        self._sanctions = sanctions
        self._other_models = other_models
        self._nat_facts = nat_facts
        """Reachability, relay addresses and relay service for our load reports."""
        self._on_load = on_load
        self._keepalive_wanted = keepalive_wanted
        self._load_topics = load_topics
        self._decoded: OrderedDict[bytes, Digest | LoadInfo] = OrderedDict()
        self._rates = OriginRateLimit(_MAX_MSGS_PER_ORIGIN_PER_S)
        self._last_delta = 0.0
        self.schedule = AnnounceSchedule(router.config.gossip)
        self._digest_changed = Wakeup()
        self._load_changed = Wakeup()
        self.busy = False
        self.published_version = 0

    # -- validation (runs inside gossipsub, before relaying) --------------------------
    def validate(self, forwarder: ID, msg: rpc_pb2.Message) -> bool:
        """The model topic's validator."""
        return self._validate(forwarder, msg, None)

    def load_topic_validator(self, count: int, index: int) -> Callable[[ID, rpc_pb2.Message], bool]:
        """The validator of load topic ``index`` of ``count``: the model topic's
        checks, then only load reports of peers that hash to this topic."""
        return lambda forwarder, msg: self._validate(forwarder, msg, (count, index))

    def _validate(self, forwarder: ID, msg: rpc_pb2.Message, load_topic: tuple[int, int] | None) -> bool:
        try:
            sender = ID(msg.from_id).to_base58()
        except Exception:
            self.counters.gossip_rejected["malformed"] += 1
            return False
        if sender == self.self_id:
            return True  # our own message (gossipsub already drops replays of it)
        try:
            if self._sanctions is not None and self._sanctions.is_distrusted(sender):
                raise GossipRejected("distrusted")
            if self._other_models is not None and sender in self._other_models:
                raise GossipRejected("other-model")
            if not self._rates.allow(sender):
                raise GossipRejected("rate")
            decoded = decode_gossip(msg.data, sender=sender, fingerprint=self.router.fingerprint_hex)
            if load_topic is not None:
                if isinstance(decoded, Digest):
                    raise GossipRejected("wrong-topic", "a digest on a load topic")
                if topic_index(sender, load_topic[0]) != load_topic[1]:
                    raise GossipRejected("wrong-topic", f"{sender} is not in load topic {load_topic[1]} of {load_topic[0]}")
        except GossipRejected as exc:
            self.counters.gossip_rejected[exc.reason] += 1
            log.debug("gossip from %s rejected: %s", sender, exc)
            if exc.fingerprint is not None and self._other_models is not None:
                self._other_models.note(sender, exc.fingerprint, "gossip on our topic", conclusive=False)
            if exc.reason in _ATTRIBUTABLE and forwarder == ID(msg.from_id) and self._sanctions is not None:
                self._sanctions.invalid_gossip(sender)
            return False
        self._decoded[msg.from_id + msg.seqno] = decoded
        while len(self._decoded) > _DECODED_CACHE:
            self._decoded.popitem(last=False)
        return True

    # -- running -------------------------------------------------------------------------
    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        self._digest_changed.bind()
        self._load_changed.bind()
        # Wake-ups instead of polls: the digest listener may run on an engine thread.
        self.router.tracker.subscribe(lambda _h, _listed: self._digest_changed.set())
        self.router.serving_listeners.append(self._load_changed.set)
        self.pubsub.set_topic_validator(self.topic, self.validate, False)
        subscription = await self.pubsub.subscribe(self.topic)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._receive_loop, subscription)
            # Load first: it carries our addresses, so a peer that hears of
            # our digest (and may route to us) can already dial us.
            await self.publish_load()
            self._digests_were_on = self.publish_digests()
            if self._digests_were_on:
                await self.publish_full()
            nursery.start_soon(self._delta_loop)
            nursery.start_soon(self._full_loop)
            nursery.start_soon(self._load_loop)
            task_status.started()

    async def _publish(self, payload: bytes, topic: str | None = None) -> None:
        try:
            await self.pubsub.publish(topic or self.topic, payload)
        except Exception as exc:  # a publish must never take the node down
            log.warning("gossip publish failed: %s", exc)

    async def publish_digest(self, digest_bytes: bytes, *, full: bool = False) -> None:
        tracker = self.router.tracker
        self.published_version = tracker.version
        if full:
            self.schedule.full_sent(tracker.epoch, tracker.version)
        payload = encode_gossip_digest(digest_bytes)
        if len(payload) > GOSSIP_MAX_BYTES:
            # Too big for one gossipsub message: announce the version in a
            # load report instead; peers that fall behind pull the digest.
            self.counters.digests_not_gossiped += 1
            await self.publish_load()
            return
        await self._publish(payload)
        self._load_changed.set()  # the next load report names this version

    async def publish_full(self) -> None:
        await self.publish_digest(self.router.full_digest(), full=True)

    async def flush_delta(self) -> None:
        """Publish pending cache changes now (before a full digest is served).

        Nothing while digests are off (directory mode): a pull served then must
        not leak the delta onto the topic, where every peer would fold it in."""
        if not self.publish_digests():
            return
        delta = self.router.take_delta()
        if delta is not None:
            self._last_delta = time.monotonic()
            await self.publish_digest(delta)

    def digest_for_pull(self) -> bytes:
        """What a digest pull gets: the full digest, or (digests off) an empty
        one at the last published version, so a gossiping peer routes to us
        by load and does not keep a copy that no delta will update."""
        if self.publish_digests():
            return self.router.full_digest()
        t = self.router.tracker
        return encode_digest(Digest("full", t.node_id, t.fingerprint, self.published_version, 0, frozenset(), epoch=t.epoch))

    def load_report(self, load: Any = None) -> Any:
        tracker = self.router.tracker
        return load_to_pb(
            self.self_id,
            self.router.fingerprint_hex,
            self.engine.load() if load is None else load,
            self.busy,
            tracker.epoch,
            self.published_version,
            self._addrs(),
            **(self._nat_facts() if self._nat_facts is not None else {}),
        )

    def _load_extra(self) -> tuple[object, ...]:
        """What a load report carries besides the load that may change: a change is news.
        The digest version too, so that a peer that missed our last digest
        learns of it from one load report, keep-alives or not."""
        facts = self._nat_facts() if self._nat_facts is not None else {}
        return (
            self.router.tracker.epoch,
            self.published_version,
            tuple(self._addrs()),
            tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in sorted(facts.items())),
        )

    async def publish_load(self) -> None:
        self.busy = self._is_busy()
        load = self.engine.load()
        self.schedule.load_sent(load, self.busy, time.monotonic(), self._load_extra())
        payload = encode_gossip_load(self.load_report(load))
        for topic in self._load_topics() if self._load_topics is not None else (self.topic,):
            await self._publish(payload, topic)

    async def _delta_loop(self) -> None:
        """A change goes out at once after a quiet spell, then batched every ``delta_interval_s``."""
        interval = self.router.config.gossip.delta_interval_s
        while True:
            on = self.publish_digests()
            if on != self._digests_were_on:
                self._digests_were_on = on
                if on:  # back to gossip (discovery auto): start from a full digest
                    await self.publish_full()
            if not on:
                await trio.sleep(max(interval, _DIGESTS_OFF_POLL_S))
                continue
            if not self.router.tracker.pending:
                await self._digest_changed.wait(60.0)
            wait = self._last_delta + interval - time.monotonic()
            if wait > 0:
                await trio.sleep(wait)
            if self.router.tracker.pending:
                await self.flush_delta()

    async def _full_loop(self) -> None:
        interval = self.router.config.gossip.full_interval_s
        tracker = self.router.tracker
        while True:
            await trio.sleep(interval * random.uniform(0.9, 1.1))
            if self.publish_digests() and self.schedule.full_due(tracker.epoch, tracker.version):
                await self.publish_full()

    async def _load_loop(self) -> None:
        """Checks the load every 50 ms while the node works (a busy flip goes out at
        once); an idle node sleeps until a request starts or its keep-alive is due."""
        gossip = self.router.config.gossip
        poll = min(_POLL_S, gossip.load_interval_s)
        while True:
            load = self.engine.load()
            busy = self._is_busy()
            keepalive = self._keepalive_wanted()
            if self.schedule.load_due(load, busy, time.monotonic(), self._load_extra(), keepalive=keepalive):
                await self.publish_load()
            if busy or load.queued_prefill_tokens > 0 or load.active_requests > 0:
                await trio.sleep(poll)
            else:
                due = self.schedule.next_load_at(self.engine.load(), self._load_extra(), keepalive=keepalive)
                # Without a keep-alive due, look again once per keep-alive interval:
                # a peer that is no longer directly connected wants them back.
                now = time.monotonic()
                await self._load_changed.wait(min(due - now, gossip.keepalive_interval_s))

    async def _receive_loop(self, subscription: Any) -> None:
        async for msg in subscription:
            try:
                self.receive(msg)
            except Exception:  # one bad message must not stop the loop
                log.exception("gossip message handling failed")

    def receive(self, msg: rpc_pb2.Message) -> None:
        """One validated message (from the model topic or a load topic)."""
        sender = ID(msg.from_id).to_base58()
        size = msg.ByteSize()
        if sender == self.self_id:
            self.counters.gossip_published += 1
            self.counters.gossip_published_bytes += size
            return
        self.counters.gossip_received += 1
        self.counters.gossip_received_bytes += size
        decoded = self._decoded.pop(msg.from_id + msg.seqno, None)
        if decoded is None:  # evicted from the cache: validate again
            try:
                decoded = decode_gossip(msg.data, sender=sender, fingerprint=self.router.fingerprint_hex)
            except GossipRejected as exc:
                self.counters.gossip_rejected[exc.reason] += 1
                return
        now = time.monotonic()
        if isinstance(decoded, Digest):
            result = self.router.on_digest(decoded, now)
            if result == "applied":
                self.counters.digests_applied += 1
            elif result == "gap":
                self.counters.digest_gaps += 1
                self._want_pull(sender, decoded.epoch, decoded.version)
            self._on_heard(sender, ())
        else:
            self.router.on_load(sender, decoded.load, decoded.busy, now)
            self._on_heard(sender, decoded.addrs)
            if self._on_load is not None:
                self._on_load(sender, decoded)
            state = self.router.view.get(sender)
            if state is not None and (state.epoch != decoded.epoch or state.version < decoded.digest_version):
                self._want_pull(sender, decoded.epoch, decoded.digest_version)
