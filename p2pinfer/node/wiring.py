"""The live node: an engine, the routing core and a libp2p overlay.

``async with Node(config) as node`` starts everything in a nursery the node
owns (host, pubsub, gossip, digest pulls, dialing, liveness, RTT probes)
and stops all of it on exit. ``node.generate(...)`` routes one request
with the core :class:`~p2pinfer.core.router.Router`, serves it here or
forwards it, falls back to the next candidate on BUSY or on a lost peer
(continuing from the tokens already produced), and ends with a
:class:`GenerateResult` that says where and why it was served.

:class:`SyncNode` runs a node on a background thread for plain scripts.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, aclosing
from dataclasses import asdict, dataclass, field, replace
import logging
import secrets
import threading
import time
from typing import Any

import trio

from ..core.attempts import (
    Attempt,
    DeadlinePassed,
    Event,
    Fail,
    Finish,
    ForwardTo,
    PeerLost,
    Refused,
    RequestAttempts,
    Sanction,
    ServeHere,
)
from ..core.attempts import Done as AttemptDone
from ..core.policies import Decision
from ..core.router import Router
from ..engines.base import (
    ChatMessage,
    Engine,
    EngineOverloadedError,
    GenerationParams,
    GenerationRecord,
    TokenChunk,
)
from ..engines.registry import load_engine
from ..net.config import NodeConfig
from ..net.counters import NodeCounters
from ..net.forward import GENERATE_PROTOCOL, DeadlineExceeded, ForwardClient, ForwardFailed, ForwardServer
from ..net.other_models import OtherModels
from ..net.sanctions import PeerSanctions
from ..net.wire import Done, RemoteError, encode_request, fingerprint_in_message

__all__ = [
    "Attempt",
    "DeadlineExceeded",
    "GenerateResult",
    "Node",
    "NodeConfig",
    "NodeError",
    "RequestFailed",
    "SyncNode",
]

log = logging.getLogger(__name__)

Prompt = str | Sequence[int] | Sequence[ChatMessage]


class NodeError(RuntimeError):
    """The node cannot do what was asked (not started, bad prompt type...)."""


class RequestFailed(NodeError):
    """Every candidate refused or failed; ``attempts`` says what each did."""

    def __init__(self, message: str, attempts: list[Attempt]) -> None:
        super().__init__(message)
        self.attempts = attempts


@dataclass
class GenerateResult:
    """The last item of :meth:`Node.generate`: what happened and why."""

    request_id: str
    served_by: str
    served_locally: bool
    hops: int
    policy: str
    reason: str
    predicted_reused_tokens: int
    reused_tokens: int
    """Realised: prompt tokens the serving engine took from its cache."""
    prompt_tokens: int
    generated_tokens: int
    token_ids: list[int]
    text: str
    finish_reason: str
    ttft_s: float
    """Measured at this node, from the call to the first token."""
    total_s: float
    record: GenerationRecord
    """The serving engine's own record (of the last attempt)."""
    attempts: list[Attempt] = field(default_factory=list)
    decision: Decision | None = None

    def as_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k not in ("record", "attempts", "decision")}
        out["record"] = asdict(self.record)
        out["attempts"] = [a.as_dict() for a in self.attempts]
        out["decision"] = self.decision.as_dict() if self.decision else None
        return out


class Node:
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
        # Imported here: libp2p takes a second to import, the CLI must not wait for it.
        from libp2p.peer.id import ID

        from ..net.gossip import GossipService
        from ..net.host import build_stack, dialable_addrs, digest_topic, run_stack
        from ..net.identity import load_or_create_identity
        from ..net.membership import Membership
        from ..net.pull import PULL_PROTOCOL, DigestPuller

        config = self.config
        if self._given_engine is not None:
            self.engine = self._given_engine
        else:
            self.engine = load_engine(config.engine, **dict(config.engine_options))
            stack.push_async_callback(self.engine.aclose)
        key_pair = load_or_create_identity(config.identity_file)
        self.peer_id = ID.from_pubkey(key_pair.public_key).to_base58()
        self.router = self._router_factory(
            self.peer_id,
            self.engine.fingerprint,
            self.engine.cache,
            config=config.router,
            secret=config.swarm_secret,
        )
        self.topic = digest_topic(self.router.fingerprint_hex)
        self._libp2p = build_stack(config, key_pair, self.topic)
        host = self._libp2p.host
        self.host = host
        self.other_models = OtherModels(self.router.fingerprint_hex)
        self.sanctions = PeerSanctions(self._libp2p.gossipsub.scorer, config.router.trust.distrust_s)

        self.forward_server = ForwardServer(
            engine=self.engine,
            fingerprint=self.router.fingerprint_hex,
            serve=self.serve_here,
            config=config,
            counters=self.counters,
            self_id=self.peer_id,
            is_busy=self.is_busy,
            other_models=self.other_models,
        )
        self.forward_client = ForwardClient(host=host, config=config, counters=self.counters)
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
        )
        self.membership = Membership(
            host=host,
            router=self.router,
            config=config,
            counters=self.counters,
            self_id=self.peer_id,
            on_meet=self._on_meet,
            on_gone=self.forward_client.drop_peer,
        )
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
        host.set_stream_handler(GENERATE_PROTOCOL, self.forward_server.handle)
        host.set_stream_handler(PULL_PROTOCOL, self.puller.handle)

        await stack.enter_async_context(run_stack(self._libp2p))
        self.addrs = dialable_addrs(host.get_addrs())
        nursery = await stack.enter_async_context(trio.open_nursery())
        self._nursery = nursery
        # Exit order (last registered runs first): close streams, then cancel the tasks.
        stack.callback(nursery.cancel_scope.cancel)
        stack.push_async_callback(self._close_streams)
        await nursery.start(self.puller.run)
        await nursery.start(self.gossip.run)
        await nursery.start(self.membership.run)
        nursery.start_soon(self.forward_client.run_janitor)
        nursery.start_soon(self.sanctions.run)
        self.started_at = time.monotonic()
        log.info("node %s listening on %s", self.peer_id, ", ".join(self.addrs))

    async def _close_streams(self) -> None:
        with trio.CancelScope(shield=True):
            self.host.remove_stream_handler(GENERATE_PROTOCOL)
            await self.forward_client.aclose()
            await self.membership.aclose()

    def _dial_addrs(self) -> list[str]:
        return [a.split("/p2p/")[0] for a in self.addrs]

    def _on_meet(self, peer_id: str) -> None:
        """A new connection: pull its digest, unless it is serving a sanction."""
        if not self.sanctions.reapply(peer_id):
            self.puller.want(peer_id)

    def _want_pull(self, peer_id: str, epoch: int, version: int) -> None:
        # Give an in-flight delta a moment before pulling the whole digest.
        grace = 2 * self.config.gossip.delta_interval_s + 0.1
        self.puller.want(peer_id, epoch, version, delay_s=grace)

    # -- state -------------------------------------------------------------------------------
    def is_busy(self) -> bool:
        """The hotspot valve: queued prefill over the threshold, or too many forwards."""
        if not hasattr(self, "forward_server"):
            return False
        return (
            self.router.is_busy(self.engine.load())
            or self.forward_server.inflight >= self.config.max_inflight_forwards
        )

    def status(self) -> dict[str, Any]:
        """Everything an operator (or /status) wants to see, JSON-ready."""
        now = time.monotonic()
        load = self.engine.load()
        peers = []
        for state in self.router.view:
            peers.append(
                {
                    "peer_id": state.peer_id,
                    "eligible": self.router.view.eligible(state, now),
                    "busy": state.is_busy(now),
                    "distrusted": state.is_distrusted(now),
                    "trust": round(state.trust, 3),
                    "rtt_ms": None if state.rtt_ms is None else round(state.rtt_ms, 3),
                    "digest_version": state.version,
                    "digest_age_s": state.digest_age(now),
                    "cached_blocks": len(state.hashes),
                    "queued_prefill_tokens": state.load.queued_prefill_tokens,
                    "last_seen_s": round(now - state.last_seen, 3),
                    "connected": state.peer_id in self.membership.connected(),
                }
            )
        return {
            "peer_id": self.peer_id,
            "addrs": list(self.addrs),
            "topic": self.topic,
            "model_fingerprint": self.router.fingerprint_hex,
            "engine": self.engine.describe(),
            "policy": self.router.policy.name,
            "uptime_s": round(now - self.started_at, 3),
            "load": {
                "queued_prefill_tokens": load.queued_prefill_tokens,
                "prefill_ms_per_token": load.prefill_ms_per_token,
                "active_requests": load.active_requests,
                "busy": self.is_busy(),
                "forwards_in_flight": self.forward_server.inflight,
            },
            "digest": {
                "version": self.router.tracker.version,
                "epoch": self.router.tracker.epoch,
                "blocks": len(self.router.tracker),
                "pending": self.router.tracker.pending,
            },
            "connected_peers": sorted(self.membership.connected()),
            "peers": peers,
            "distrusted_peers": self.sanctions.remaining(),
            "gossip_scores": self._gossip_scores(),
            "other_model_peers": self.other_models.as_dict(),
            "streams_per_peer": dict(self.forward_server.streams),
            "counters": self.counters.as_dict(),
        }

    def _gossip_scores(self) -> dict[str, float]:
        """gossipsub's peer score of each connected peer (0 unless we penalised it)."""
        scorer = self._libp2p.gossipsub.scorer
        out: dict[str, float] = {}
        if scorer is None:
            return out
        for peer in self.host.get_connected_peers():
            try:
                out[peer.to_base58()] = round(scorer.score(peer, [self.topic]), 3)
            except Exception:  # scoring is advisory; never break /status
                continue
        return out

    async def wait_for_peers(self, count: int, timeout_s: float = 30.0) -> None:
        """Until ``count`` peers are eligible for work (raises ``trio.TooSlowError``)."""
        with trio.fail_after(timeout_s):
            while sum(self.router.view.eligible(p, time.monotonic()) for p in self.router.view) < count:
                await trio.sleep(0.05)

    # -- requests --------------------------------------------------------------------------
    def tokens_for(self, prompt: Prompt) -> list[int]:
        """Tokenise once, here at the entry node, with the engine's own tokenizer."""
        if isinstance(prompt, str):
            return self.engine.tokenize(prompt)
        items = list(prompt)
        if items and all(isinstance(m, Mapping) for m in items):
            return self.engine.chat_tokens(items)  # type: ignore[arg-type]
        if all(type(t) is int for t in items):
            return items  # type: ignore[return-value]
        raise NodeError("prompt must be text, a list of chat messages or a list of token ids")

    async def generate(
        self,
        prompt: Prompt,
        params: GenerationParams | None = None,
        *,
        prefer: str | None = None,
        timeout_s: float | None = None,
        **overrides: Any,
    ) -> AsyncIterator[TokenChunk | GenerateResult]:
        """Stream :class:`TokenChunk` items, then one :class:`GenerateResult`.

        ``prefer`` (a peer id, or ``"local"``) is tried first, before the
        policy's ranking. Raises ``InvalidRequestError`` for a bad request,
        :class:`RequestFailed` when nobody could serve it and
        :class:`DeadlineExceeded` after ``timeout_s``. Close the iterator
        (``contextlib.aclosing``) to abandon a request: the serving peer's
        stream is reset and its engine freed.
        """
        if self._nursery is None:
            raise NodeError("the node is not running (use `async with Node(...)`)")
        params = replace(params or GenerationParams(), **overrides)
        tokens = self.tokens_for(prompt)
        self.engine.validate_tokens(tokens, params)
        self.counters.requests += 1
        t0 = time.perf_counter()
        deadline = trio.current_time() + (timeout_s or self.config.request_timeout_s)
        request_id = secrets.token_bytes(16)
        decision, hashes = self.router.route(tokens, self.engine.load(), time.monotonic())
        life = self.new_attempts(decision, tokens, hashes, params.max_tokens, prefer)
        out: list[int] = []
        text: list[str] = []
        ttft: float | None = None
        record: GenerationRecord | None = None
        actions = deque(life.start())
        while actions:
            action = actions.popleft()
            if isinstance(action, Finish):
                break
            if isinstance(action, Sanction):
                self.counters.peers_distrusted += 1
                self.sanctions.distrust(action.peer, action.reason)  # keeps it out: no gossip, no pull
                continue
            if isinstance(action, Fail):
                self.counters.requests_failed += 1
                if action.reason == "deadline":
                    raise DeadlineExceeded(action.message)
                raise RequestFailed(action.message, life.attempts)
            # ForwardTo or ServeHere: one try, from the tokens produced so far.
            if action.resume_from:
                self.counters.resumed += 1
            run_tokens = tokens + out
            run_params = replace(params, max_tokens=params.max_tokens - action.resume_from)
            if isinstance(action, ServeHere):
                source = self.serve_here(run_tokens, run_params, deadline)
            else:
                wire = encode_request(
                    request_id=request_id,
                    tokens=run_tokens,
                    params=run_params,
                    hops=1,
                    deadline_ms=int(max(0.0, deadline - trio.current_time()) * 1000) or 1,
                    fingerprint=self.router.fingerprint_hex,
                    predicted_match_tokens=action.predicted_match_tokens,
                    origin=self.peer_id,
                    resumed_tokens=action.resume_from,
                )
                source = self.forward_client.stream(action.peer, wire, deadline=deadline)
            generated = 0
            event: Event
            try:
                async with aclosing(source) as items:
                    async for item in items:
                        if isinstance(item, TokenChunk):
                            if ttft is None:
                                ttft = time.perf_counter() - t0
                            out.extend(item.token_ids)
                            text.append(item.text)
                            generated += len(item.token_ids)
                            yield item
                        elif isinstance(item, Done):
                            record = item.record
                        else:
                            record = item
                assert record is not None
                event = AttemptDone(record.reused_tokens, generated)
            except RemoteError as exc:
                event = Refused(exc.code, exc.message, generated)
                self._on_refusal(action, exc)
            except ForwardFailed as exc:
                event = PeerLost(str(exc), generated)
                self.counters.forward_failures += 1
                self.counters.fallbacks += 1
                log.info("forward to %s lost: %s", life.current.target, exc)
            except EngineOverloadedError as exc:
                event = Refused("BUSY", str(exc), generated)
                self.counters.fallbacks += 1
            except DeadlineExceeded as exc:
                event = DeadlinePassed(str(exc))
            actions.extend(life.handle(event, time.monotonic()))
        served = life.current
        total = time.perf_counter() - t0
        if record is None or served.outcome != "done":  # every token arrived, the final record did not
            record = GenerationRecord(len(tokens), 0, len(out), ttft or total, total, "length")
        if served.local:
            self.counters.served_local += 1
        else:
            self.counters.served_remote += 1
        attempts = life.attempts
        reason = decision.reason
        if len(attempts) > 1:
            reason += f"; served by attempt {len(attempts)} after " + ", ".join(
                f"{a.target[:12]} {a.outcome}" for a in attempts[:-1]
            )
        if prefer:
            reason = f"preferred {prefer[:12]}; " + reason
        yield GenerateResult(
            request_id=request_id.hex(),
            served_by=served.target,
            served_locally=served.local,
            hops=0 if served.local else 1,
            policy=decision.policy,
            reason=reason,
            predicted_reused_tokens=served.predicted_reused_tokens,
            reused_tokens=record.reused_tokens,
            prompt_tokens=len(tokens),
            generated_tokens=len(out),
            token_ids=out,
            text="".join(text),
            finish_reason=record.finish_reason,
            ttft_s=ttft if ttft is not None else total,
            total_s=total,
            record=record,
            attempts=attempts,
            decision=decision,
        )

    async def complete(self, prompt: Prompt, params: GenerationParams | None = None, **kwargs: Any) -> GenerateResult:
        """:meth:`generate` without the stream: just the result."""
        async with aclosing(self.generate(prompt, params, **kwargs)) as items:
            async for item in items:
                if isinstance(item, GenerateResult):
                    return item
        raise NodeError("generation ended without a result")  # pragma: no cover

    def new_attempts(
        self, decision: Decision, tokens: list[int], hashes: Sequence[int], max_tokens: int, prefer: str | None = None
    ) -> RequestAttempts:
        """The lifecycle of a request entering here (the simulator's nodes build the same)."""
        return RequestAttempts(self.router, decision, tokens, hashes, max_tokens=max_tokens, prefer=prefer)

    def _on_refusal(self, action: ForwardTo | ServeHere, exc: RemoteError) -> None:
        """The edge's part of a refusal (the lifecycle does the routing part)."""
        self.counters.refusals_received[exc.code] += 1
        self.counters.fallbacks += 1
        if isinstance(action, ForwardTo) and exc.code == "MODEL_MISMATCH":
            # Its engine runs another model (whatever its gossip claimed): its gossip is refused from now on.
            self.other_models.note(action.peer, fingerprint_in_message(exc.message), "its answer to a forwarded request")
            return
        log.info("peer %s refused: %s %s", getattr(action, "peer", "local"), exc.code, exc.message)

    async def serve_here(
        self, tokens: list[int], params: GenerationParams, deadline: float
    ) -> AsyncIterator[TokenChunk | GenerationRecord]:
        """Run a request on this node's engine: the one path for local and
        forwarded requests. Its prompt is listed in our digest while it is
        served; raises :class:`DeadlineExceeded` at ``deadline`` (trio clock)."""
        # No cancel scope may span a `yield` in an async generator, so the
        # deadline is applied to each step separately.
        items = self.engine.generate(tokens, params)
        in_service = self.router.begin_serving(tokens)
        try:
            while True:
                got = False
                with trio.move_on_at(deadline):
                    try:
                        item = await items.__anext__()
                    except StopAsyncIteration:
                        return
                    got = True
                if not got:
                    raise DeadlineExceeded("local generation passed its deadline")
                yield item
        finally:
            try:
                await items.aclose()
            finally:
                self.router.end_serving(in_service)


# -- a blocking wrapper for scripts -------------------------------------------------------------


class SyncNode:
    """Runs a :class:`Node` on its own thread with its own trio loop.

    For scripts and notebooks that do not use trio::

        with SyncNode(NodeConfig(...)) as node:
            print(node.complete("Hello").text)
    """

    def __init__(self, config: NodeConfig | None = None, *, engine: Engine | None = None, start_timeout_s: float = 60.0) -> None:
        self._node = Node(config, engine=engine)
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="p2pinfer-node", daemon=True)
        self._thread.start()
        if not self._ready.wait(start_timeout_s):
            raise NodeError(f"node did not start within {start_timeout_s} s")
        if self._error is not None:
            raise NodeError(f"node failed to start: {self._error}") from self._error

    def _main(self) -> None:
        async def main() -> None:
            self._token = trio.lowlevel.current_trio_token()
            self._stop = trio.Event()
            try:
                async with self._node:
                    self._ready.set()
                    await self._stop.wait()
            except BaseException as exc:
                self._error = exc
                raise

        try:
            trio.run(main)
        except BaseException as exc:  # reported through _error
            self._error = self._error or exc
        finally:
            self._ready.set()

    @property
    def node(self) -> Node:
        return self._node

    @property
    def peer_id(self) -> str:
        return self._node.peer_id

    @property
    def addrs(self) -> list[str]:
        return list(self._node.addrs)

    def _call(self, fn: Any, *args: Any) -> Any:
        if self._token is None or not self._thread.is_alive():
            raise NodeError("the node is not running")
        return trio.from_thread.run(fn, *args, trio_token=self._token)

    def complete(self, prompt: Prompt, params: GenerationParams | None = None, **kwargs: Any) -> GenerateResult:
        async def run() -> GenerateResult:
            return await self._node.complete(prompt, params, **kwargs)

        return self._call(run)

    def status(self) -> dict[str, Any]:
        return trio.from_thread.run_sync(self._node.status, trio_token=self._token)

    def wait_for_peers(self, count: int, timeout_s: float = 30.0) -> None:
        self._call(self._node.wait_for_peers, count, timeout_s)

    def close(self) -> None:
        if self._token is not None and self._stop is not None and self._thread.is_alive():
            try:
                trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
            except trio.RunFinishedError:
                pass
        self._thread.join(30)

    def __enter__(self) -> SyncNode:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
