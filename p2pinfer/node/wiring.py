"""A live node's wiring: its engine, routing core and libp2p services, in one nursery.

``async with Node(config) as node`` starts everything in a nursery the node
owns (host, pubsub, gossip, digest pulls, dialing, liveness, RTT probes,
reachability, relays, hole punching) and stops all of it on exit. Its
requests are in ``serving.py``, its status report in ``status.py``, its NAT
traversal in ``nat.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
import logging
import time
from typing import Any

import trio

from ..core.attempts import Attempt
from ..core.router import Router
from ..core.swarm_models import SwarmModels
from ..core.verify import SpotChecks
from ..engines.base import Engine
from ..engines.registry import load_engine
from ..net.config import NodeConfig
from ..net.counters import NodeCounters
from ..net.forward import GENERATE_PROTOCOL, DeadlineExceeded, ForwardClient, ForwardServer
from ..net.other_models import OtherModels
from ..net.sanctions import PeerSanctions
from .decisions import DecisionLog, PrefixGroups
from .discovery import NodeDiscovery
from .nat import NodeNat
from .results import GenerateResult, NodeError, RequestFailed
from .serving import NodeServing
from .status import NodeStatus

__all__ = ["Attempt", "DeadlineExceeded", "GenerateResult", "Node", "NodeConfig", "NodeError", "RequestFailed"]

log = logging.getLogger("p2pinfer.node")


class Node(NodeDiscovery, NodeServing, NodeStatus, NodeNat):
    """One peer of the swarm; see the module docstring."""

    def __init__(
        self,
        config: NodeConfig | None = None,
        *,
        engine: Engine | None = None,
        router_factory: Callable[..., Router] = Router,
    ) -> None:
        """``engine``: use this engine instead of loading ``config.engine``.
        ``router_factory``: builds the routing core, with :class:`Router`'s
        arguments (the lab passes its lying router here)."""
        self.config = config or NodeConfig()
        self._given_engine = engine
        self._router_factory = router_factory
        self.counters = NodeCounters()
        self.decisions = DecisionLog()
        """Recent requests that entered here and where they went (the dashboard's routing feed)."""
        self._stack: AsyncExitStack | None = None
        self._nursery: trio.Nursery | None = None
        self._started = False
        self.engine: Engine
        self.router: Router
        self.peer_id = ""
        self.started_at = 0.0

    # -- lifecycle ------------------------------------------------------------------------
    async def __aenter__(self) -> Node:
        if self._started:
            raise NodeError("a Node can be started once")
        self._started = True
        stack = AsyncExitStack()
        await stack.__aenter__()
        try:
            await self._start(stack)
        except BaseException as exc:
            await stack.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        self._stack = stack
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        stack, self._stack = self._stack, None
        if stack is None:
            return None
        return await stack.__aexit__(*exc_info)

    async def _start(self, stack: AsyncExitStack) -> None:
        """The engine, the identity and the routing core, then the services."""
        # Imported here: libp2p takes a second to import, the CLI must not wait for it.
        from libp2p.peer.id import ID

        from ..net.identity import load_or_create_identity

        config = self.config
        if self._given_engine is not None:
            self.engine = self._given_engine
        else:
            self.engine = load_engine(config.engine, **dict(config.engine_options))
            stack.push_async_callback(self.engine.aclose)
        key_pair = load_or_create_identity(config.key_file)
        self.peer_id = ID.from_pubkey(key_pair.public_key).to_base58()
        self.router = self._router_factory(
            self.peer_id,
            self.engine.fingerprint,
            self.engine.cache,
            config=config.router,
            secret=config.swarm_secret,
        )
        self.prefix_groups = PrefixGroups(self.router.hasher.block_size)
        self._replies_in_service: dict[int, list[int]] = {}
        self.engine.watch_reply_saves(self._reply_save)
        self._build_services(key_pair)
        await self._run_services(stack)
        self.started_at = time.monotonic()
        log.info("node %s listening on %s", self.peer_id, ", ".join(self.addrs))

    def _reply_save(self, path: Sequence[int], started: bool) -> None:
        """A reply being saved after its answer ended is listed like a prompt in
        service: a next turn queued behind the save finds prompt and reply cached
        (the engine holds it until then), so peers route it here meanwhile."""
        if started:
            self._replies_in_service[id(path)] = self.router.begin_serving(path)
        elif (hashes := self._replies_in_service.pop(id(path), None)) is not None:
            self.router.end_serving(hashes)

    def _build_services(self, key_pair: Any) -> None:
        """The libp2p stack and the services around the router, wired to each other."""
        from ..net.gossip import GossipService
        from ..net.host import build_stack, digest_topic
        from ..net.membership import Membership
        from ..net.model_gossip import ModelGossip
        from ..net.check import CHECK_PROTOCOL, CheckService
        from ..net.pull import PULL_PROTOCOL, DigestPuller

        config = self.config
        self.topic = digest_topic(self.router.fingerprint_hex)
        self._libp2p = build_stack(config, key_pair, self.topic, self.counters)
        host = self._libp2p.host
        self.host = host
        self.other_models = OtherModels(self.router.fingerprint_hex)
        model_interval = self.router.config.gossip.model_interval_s
        self.swarm_models = SwarmModels(self.peer_id, self.router.fingerprint_hex, self.engine.model_name, model_interval)
        self.sanctions = PeerSanctions(self._libp2p.gossipsub.scorer, config.router.trust.distrust_s)
        self.spot_checks = SpotChecks(config.router.verify)

        self.forward_server = ForwardServer(
            engine=self.engine,
            fingerprint=self.router.fingerprint_hex,
            serve=self.serve_here,
            config=config,
            counters=self.counters,
            self_id=self.peer_id,
            is_busy=self.is_busy,
            other_models=self.other_models,
            delegate=self.serve_delegated,
        )
        self._build_nat()
        self.forward_client = ForwardClient(
            host=host,
            config=config,
            counters=self.counters,
            connect=lambda peer, deadline: self.connector.ensure(peer, deadline=deadline),
            path_of_stream=self._path_of_stream,
        )
        self.gossip = GossipService(
            pubsub=self._libp2p.pubsub,
            topic=self.topic,
            router=self.router,
            engine=self.engine,
            counters=self.counters,
            self_id=self.peer_id,
            addrs=self._dial_addrs,
            is_busy=self.is_busy,
            on_heard=lambda peer, addrs: self.membership.learn(peer, addrs),
            want_pull=self._want_pull,
            sanctions=self.sanctions,
            other_models=self.other_models,
            publish_digests=self.digests_on,
            nat_facts=self._nat_facts,
            on_load=lambda peer, info: self.membership.learn_load(
                peer, info.reachability, info.relay_addrs, info.relay_service
            ),
            keepalive_wanted=lambda: self.membership.keepalive_wanted(),
            load_topics=self.load_report_topics,
        )
        self.model_gossip = ModelGossip(
            pubsub=self._libp2p.pubsub,
            models=self.swarm_models,
            counters=self.counters,
            self_id=self.peer_id,
            addrs=self._dial_addrs,
            on_heard=lambda peer, addrs: self.membership.learn(peer, addrs),
            sanctions=self.sanctions,
        )
        self.membership = Membership(
            host=host,
            router=self.router,
            config=config,
            counters=self.counters,
            self_id=self.peer_id,
            on_meet=self._on_meet,
            on_gone=self.forward_client.drop_peer,
            on_disconnected=self.swarm_models.forget,
            connect=lambda peer, allow_relay: self.connector.ensure(peer, allow_relay=allow_relay),
            relayed_peers=lambda: sum(1 for path in self.paths.paths.values() if path == "relayed"),
            path_of_stream=self._path_of_stream,
            best_path=self.paths.path,
        )
        self._learn_static_relays()
        self.puller = DigestPuller(
            host=host,
            router=self.router,
            gossip=self.gossip,
            counters=self.counters,
            known_peers=self.membership.known_peers,
            learn=self.membership.learn,
            timeout_s=config.connect_timeout_s,
            sanctions=self.sanctions,
            other_models=self.other_models,
        )
        self.checker = CheckService(
            host=host,
            engine=self.engine,
            fingerprint=self.router.fingerprint_hex,
            counters=self.counters,
            is_busy=self.is_busy,
            distrusted=self.sanctions.is_distrusted,
            connect=lambda peer, deadline: self.connector.ensure(peer, deadline=deadline),
            timeout_s=config.request_timeout_s,
        )
        host.set_stream_handler(GENERATE_PROTOCOL, self.forward_server.handle)
        host.set_stream_handler(PULL_PROTOCOL, self.puller.handle)
        host.set_stream_handler(CHECK_PROTOCOL, self.checker.handle)
        self._build_directory()

    async def _run_services(self, stack: AsyncExitStack) -> None:
        """Start the host, then every background task in the node's nursery."""
        from ..net.host import dialable_addrs, run_stack

        await stack.enter_async_context(run_stack(self._libp2p))
        self.addrs = dialable_addrs(self.host.get_addrs())
        await self._run_nat(stack)
        nursery = await stack.enter_async_context(trio.open_nursery())
        self._nursery = nursery
        # Exit order (last registered runs first): close streams, then cancel the tasks.
        stack.callback(nursery.cancel_scope.cancel)
        stack.push_async_callback(self._close_streams)
        await nursery.start(self.puller.run)
        await nursery.start(self.gossip.run)
        await nursery.start(self.model_gossip.run)
        await nursery.start(self.membership.run)
        await self._run_directory(stack, nursery)
        await self._start_nat_tasks(nursery)
        nursery.start_soon(self.forward_client.run_janitor)
        nursery.start_soon(self.sanctions.run)

    async def _close_streams(self) -> None:
        with trio.CancelScope(shield=True):
            self.host.remove_stream_handler(GENERATE_PROTOCOL)
            await self.forward_client.aclose()
            await self.membership.aclose()

    def _dial_addrs(self) -> list[str]:
        return [a.split("/p2p/")[0] for a in self.addrs]

    def _on_meet(self, peer_id: str) -> None:
        """A new connection (or a connected peer still not in the view): pull its
        digest, unless it is serving a sanction or runs another model."""
        if not self.sanctions.reapply(peer_id) and peer_id not in self.other_models:
            self.puller.want(peer_id)

    def _want_pull(self, peer_id: str, epoch: int, version: int) -> None:
        # Give an in-flight delta a moment before pulling the whole digest.
        grace = 2 * self.config.gossip.delta_interval_s + 0.1
        self.puller.want(peer_id, epoch, version, delay_s=grace)

    # -- state -------------------------------------------------------------------------------
    def is_busy(self) -> bool:
        """The hotspot valve: queued prefill over the threshold, or too many
        forwards; and always once the engine cannot generate (peers stay away)."""
        if self.engine.failure is not None:
            return True
        if not hasattr(self, "forward_server"):
            return False
        return (
            self.router.over_busy_queue(self.engine.load())
            or self.forward_server.inflight >= self.config.max_inflight_forwards
        )

    async def wait_for_peers(self, count: int, timeout_s: float = 30.0) -> None:
        """Until ``count`` peers are eligible for work (raises ``trio.TooSlowError``)."""
        with trio.fail_after(timeout_s):
            while sum(self.router.view.eligible(p, time.monotonic()) for p in self.router.view) < count:
                await trio.sleep(0.05)
