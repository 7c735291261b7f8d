"""How a live node learns who caches what: gossiped digests, the prefix directory, or both.

``NodeConfig.discovery``:

* ``gossip``: every node publishes its digest on the model's topic; the
  policy reads the peer view those digests fill;
* ``directory``: the node runs py-libp2p's KadDHT (placement) and the
  prefix directory (:mod:`p2pinfer.net.directory`), registers its anchors,
  asks an anchor's owner before each decision, and publishes no digests
  (load reports still go out, and digest pulls get an empty digest);
* ``auto``: registers always, publishes digests while the swarm (the peers
  it knows, itself included, or its KadDHT placement's members if more:
  :meth:`NodeDiscovery.swarm_estimate`) is smaller than ``auto_directory_nodes``, and
  from that size on stops them and queries the directory instead.

While a node queries the directory its load reports go on a small load
topic (:mod:`p2pinfer.net.load_gossip`), so the reports it hears stay about
``load_topic_nodes`` whatever the swarm's size; the loads of holders outside
its topic come with the directory's answers.

Mixed swarms keep working: a directory node's policy still reads the
digests gossiping peers publish (``DirectoryView`` merges both), a
gossiping node sees directory nodes by their load reports only (which go
on the model topic while any known peer lacks the directory protocol), and
only nodes that speak the directory protocol are made owners of anchors.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from dataclasses import replace
import time
from typing import Any

import trio

from ..core.directory import DirectoryView, apply_answer, vouched_by
from ..core.policies import Decision
from ..core.router import Router
from ..engines.base import Engine
from ..net.config import NodeConfig

__all__ = ["NodeDiscovery"]


class NodeDiscovery:
    """A mixin of :class:`~p2pinfer.node.Node`: its discovery mode."""

    config: NodeConfig
    engine: Engine
    router: Router
    peer_id: str
    host: Any
    gossip: Any
    _libp2p: Any
    directory: Any = None
    """The node's :class:`~p2pinfer.net.directory.DirectoryService` (``None`` in gossip mode)."""
    dht: Any = None
    load_topics: Any = None
    """The node's :class:`~p2pinfer.net.load_gossip.LoadTopics` (``None`` in gossip mode)."""
    topic: str

    def swarm_size(self) -> int:
        """The peers this node knows, itself included."""
        return len(self.router.view) + 1

    def swarm_estimate(self) -> int:
        """The swarm's size as this node sees it, for the number of load topics:
        its view or its KadDHT placement's members, whichever is larger (the
        view alone shrinks once the node hears only its own load topic)."""
        members = len(self.directory.placement.members()) if self.directory is not None else 0
        return max(self.swarm_size(), members)

    def mixed_swarm(self) -> bool:
        """Whether a peer this node knows (in its view or connected) is known
        (by identify) not to speak the directory protocol: a gossip-mode peer."""
        if self.directory is None:
            return False
        placement = self.directory.placement
        peers = {p.peer_id for p in self.router.view} | {p.to_base58() for p in self.host.get_connected_peers()}
        return any(placement.lacks_directory(peer) for peer in peers)

    def load_report_topics(self) -> tuple[str, ...]:
        """Where this node's load reports go now (the gossip service asks before each)."""
        return self.load_topics.publish_topics() if self.load_topics is not None else (self.topic,)

    def digests_on(self) -> bool:
        mode = self.config.discovery
        # The estimate, not the view alone: past the switch the node hears only its load
        # topic, its view of peers it is not connected to shrinks, and it must not switch back.
        return mode == "gossip" or (mode == "auto" and self.swarm_estimate() < self.config.auto_directory_nodes)

    def querying_directory(self) -> bool:
        return self.directory is not None and not self.digests_on()

    def _build_directory(self) -> None:
        if self.config.discovery == "gossip":
            return
        from libp2p.kad_dht.kad_dht import DHTMode, KadDHT

        from ..net.directory import DIRECTORY_PROTOCOL, DhtPlacement, DirectoryService

        self.dht = KadDHT(self.host, DHTMode.SERVER, enable_random_walk=False, enable_providers=False, enable_values=False)
        placement = DhtPlacement(self.host, self.dht, self.peer_id, self.config.directory.replicas)
        self.directory = DirectoryService(
            host=self.host,
            router=self.router,
            placement=placement,
            config=self.config.directory,
            load=self.engine.load,
            timeout_s=self.config.connect_timeout_s,
            distrusted=lambda peer: self.sanctions.is_distrusted(peer),
        )
        self.host.set_stream_handler(DIRECTORY_PROTOCOL, self.directory.handle)
        self._build_load_topics()

    def _build_load_topics(self) -> None:
        from ..core.load_topics import LoadTopicState
        from ..net.load_gossip import LoadTopics

        gossip = self.gossip
        state = LoadTopicState(
            self.peer_id, self.router.fingerprint_hex, self.config.load_topic_nodes, grace_s=self.config.gossip.peer_ttl_s
        )
        self.load_topics = LoadTopics(
            pubsub=self._libp2p.pubsub,
            state=state,
            model_topic=self.topic,
            active=self.querying_directory,
            mixed=self.mixed_swarm,
            estimate=self.swarm_estimate,
            validator=gossip.load_topic_validator,
            receive=gossip.receive,
            self_id=self.peer_id,
        )

    async def _run_directory(self, stack: AsyncExitStack, nursery: trio.Nursery) -> None:
        if self.directory is None:
            return
        from libp2p.tools.anyio_service import background_trio_service

        await stack.enter_async_context(background_trio_service(self.dht))
        await nursery.start(self.directory.run)
        await nursery.start(self.load_topics.run)

    async def route_tokens(self, tokens: list[int]) -> tuple[Decision, list[int]]:
        """The policy's decision for ``tokens``: over the peer view, plus the
        directory's answer when the node queries it (one round trip)."""
        router = self.router
        if not self.querying_directory():
            return router.route(tokens, self.engine.load(), time.monotonic())
        hashes = router.hasher.hashes(tokens)
        found = await self.directory.lookup(hashes, len(tokens))
        answer, owner = found if found is not None else (None, None)
        now = time.monotonic()
        vouched: tuple[tuple[str, str], ...] = ()
        if answer is not None and answer.holders:
            assert owner is not None
            vouched = vouched_by(router.view, answer, hashes, owner)
            apply_answer(router.view, answer, now, router.fingerprint_hex)
        view = DirectoryView(router.view, answer, router.hasher.block_size)
        decision, hashes = router.route(tokens, self.engine.load(), now, hashes=hashes, view=view)
        return (replace(decision, vouched_by=vouched) if vouched else decision), hashes
