"""A request on a live node: tokenise once, route, then run the core's
request lifecycle (:class:`~p2pinfer.core.attempts.RequestAttempts`):
serve here or forward, fall back on BUSY or a lost peer (continuing from the
tokens already produced), sanction an overclaiming peer, and end with a
:class:`~p2pinfer.node.results.GenerateResult`.

:meth:`NodeServing.serve_here` is the one path by which this node's engine
serves a request, local or forwarded (the forward server is given it).
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field, replace
import json
import logging
import random
import secrets
import time
from typing import Any

import trio

from ..core.attempts import (
    DeadlinePassed,
    Event,
    Fail,
    Finish,
    ForwardTo,
    PeerLost,
    Refused,
    Rejected,
    RequestAttempts,
    Sanction,
    ServeHere,
    StoppedAtEntry,
)
from ..core.attempts import Done as AttemptDone
from ..core.attempts import Attempt
from ..core.policies import Decision
from ..core.router import Router
from ..core.swarm_models import SwarmModels
from ..core.peers import PeerState
from ..core.verify import CheckPlan, SpotChecks, Verdict, checkable, judge, pick_verifier
from ..engines.base import (
    Engine,
    EngineError,
    EngineOverloadedError,
    GenerationParams,
    GenerationRecord,
    InvalidRequestError,
    PromptTooLongError,
    TokenChunk,
)
from ..engines.text_stream import AnswerText
from ..net.config import NodeConfig
from ..net.check import CheckService, CheckUnavailable
from ..net.counters import NodeCounters
from ..net.forward import DeadlineExceeded, ForwardClient, ForwardFailed
from ..net.other_models import OtherModels
from ..net.sanctions import PeerSanctions
from ..net.wire import ChatLine, Done, RemoteError, Request, WireError, encode_request, fingerprint_in_message
from .decisions import DecisionLog, PrefixGroups, prompt_label
from .results import GenerateResult, ModelUnavailable, NodeError, Prompt, RequestFailed, ToolPrompt

__all__ = ["NodeServing"]

log = logging.getLogger("p2pinfer.node")


@dataclass
class _Answer:
    """What the client has been given so far, over every try of one request."""

    t0: float
    """When the request entered (``time.perf_counter``)."""
    rendering: AnswerText
    """Renders the client's text from the token ids, here, over every try: a peer's
    text is never shown (answer checks judge ids), and a try's held-back tail is
    not lost when the next try resumes."""
    tokens: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    logprobs: list[Any] = field(default_factory=list)
    ttft: float | None = None

    def accept(self, chunk: TokenChunk) -> TokenChunk:
        """A chunk the client gets (streamed, or released after its check): the answer so far grows.

        Returns the chunk with its text rendered here (what the client is sent)."""
        chunk = replace(chunk, text=self.rendering.feed(chunk.token_ids))
        self.tokens.extend(chunk.token_ids)
        self.text.append(chunk.text)
        self.logprobs.extend(chunk.logprobs)
        if self.ttft is None:
            self.ttft = time.perf_counter() - self.t0
        return chunk

    def tail(self) -> TokenChunk | None:
        """The text still held when the answer ended before its last token (a stop, an end of generation)."""
        rest = self.rendering.flush()
        if not rest:
            return None
        self.text.append(rest)
        return TokenChunk((), rest)


@dataclass
class _TryEnded:
    """How one try ended: the lifecycle's event, and the serving engine's record when it completed."""

    event: Event
    record: GenerationRecord | None


class NodeServing:
    """A mixin of :class:`~p2pinfer.node.Node`: its requests."""

    config: NodeConfig
    engine: Engine
    router: Router
    counters: NodeCounters
    forward_client: ForwardClient
    other_models: OtherModels
    sanctions: PeerSanctions
    spot_checks: SpotChecks
    checker: CheckService
    swarm_models: SwarmModels
    peer_id: str
    decisions: DecisionLog
    prefix_groups: PrefixGroups
    _nursery: trio.Nursery | None
    _rng = random.Random()
    route_tokens: Callable[[list[int]], Awaitable[tuple[Decision, list[int]]]]
    """The policy's decision and the block hashes (:class:`~p2pinfer.node.discovery.NodeDiscovery`)."""

    def tokens_for(self, prompt: Prompt) -> list[int]:
        """Tokenise once, here at the entry node, with the engine's own tokenizer."""
        if isinstance(prompt, str):
            return self.engine.tokenize(prompt)
        if isinstance(prompt, ToolPrompt):
            return self.engine.chat_tokens(list(prompt.messages), tools=list(prompt.tools))
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
        model: str | None = None,
        **overrides: Any,
    ) -> AsyncIterator[TokenChunk | GenerateResult]:
        """Stream :class:`TokenChunk` items, then one :class:`GenerateResult`.

        ``prefer`` (a peer id, or ``"local"``) is tried first, before the
        policy's ranking. ``model``: the fingerprint of the model to run
        (default: this node's); for another model the request is delegated
        to a node that serves it (:meth:`_generate_elsewhere`). Raises
        ``InvalidRequestError`` for a bad request, :class:`RequestFailed`
        when nobody could serve it, :class:`ModelUnavailable` when no node
        serves ``model`` now, and :class:`DeadlineExceeded` after
        ``timeout_s``. Close the iterator (``contextlib.aclosing``) to
        abandon a request: the serving peer's stream is reset and its engine
        freed.
        """
        if self._nursery is None:
            raise NodeError("the node is not running (use `async with Node(...)`)")
        params = replace(params or GenerationParams(), **overrides)
        if model is not None and model != self.router.fingerprint_hex:
            async with aclosing(self._generate_elsewhere(model, prompt, params, timeout_s)) as items:
                async for item in items:
                    yield item
            return
        tokens = self.tokens_for(prompt)
        self.engine.validate_tokens(tokens, params)
        self.counters.requests += 1
        t0 = time.perf_counter()
        deadline = trio.current_time() + (timeout_s or self.config.request_timeout_s)
        request_id = secrets.token_bytes(16)
        decision, hashes = await self.route_tokens(tokens)
        decision_s = time.perf_counter() - t0
        life = self.new_attempts(decision, tokens, hashes, params.max_tokens, prefer)
        answer = _Answer(t0, AnswerText(self.engine.token_bytes, params.stop, params.max_tokens))
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
                self._log_decision(tokens, hashes, decision, life.attempts, outcome="deadline" if action.reason == "deadline" else "failed",
                                   total_s=time.perf_counter() - t0, reason=action.message)
                if action.reason == "deadline":
                    raise DeadlineExceeded(action.message)
                raise RequestFailed(action.message, life.attempts)
            ended: _TryEnded | None = None
            async with aclosing(self._try(life, action, tokens, answer, params, deadline, request_id)) as steps:
                async for step in steps:
                    if isinstance(step, TokenChunk):
                        yield step
                    else:
                        ended = step
            assert ended is not None
            record = ended.record  # used only when this try completed the request
            actions.extend(life.handle(ended.event, time.monotonic()))
        tail = answer.tail()
        if tail is not None:
            yield tail
        yield self._result(life, decision, decision_s, tokens, hashes, answer, record, request_id, prefer)

    async def _try(
        self,
        life: RequestAttempts,
        action: ForwardTo | ServeHere,
        tokens: list[int],
        answer: _Answer,
        params: GenerationParams,
        deadline: float,
        request_id: bytes,
    ) -> AsyncIterator[TokenChunk | _TryEnded]:
        """One try of ``action`` (serve here, or forward), from the tokens the client already has.

        Yields the chunks the client may see (a checked window only once it
        passed), then one :class:`_TryEnded` with the lifecycle's event.
        """
        if action.resume_from:
            self.counters.resumed += 1
        run_tokens = tokens + answer.tokens
        run_params = replace(params, max_tokens=params.max_tokens - action.resume_from)
        attempt = life.current
        facts: dict[str, object] = {}
        if isinstance(action, ServeHere):
            attempt.path = "local"
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
            source = self._in_vocabulary(self.forward_client.stream(action.peer, wire, deadline=deadline, facts=facts),
                                         action.peer)
        generated = 0
        record: GenerationRecord | None = None
        event: Event
        check: CheckPlan = self._check_plan(action.peer, params) if isinstance(action, ForwardTo) else "none"
        spot = check == "after"
        """A spot check (within ``VerifyConfig.budget``), not a probation check."""
        window = self.spot_checks.config.probation_hold_tokens if check == "hold" else 0
        """Held tokens checked on their own before the rest streams (0: the whole answer is held)."""
        held: list[TokenChunk] = []
        """Chunks of an answer held back until they are checked."""
        produced: list[int] = []
        """Every token this try's source produced, held or not (what a check judges)."""
        rejected: Verdict | None = None
        """The failed check of a held window (the peer's stream is dropped there)."""
        try:
            async with aclosing(source) as items:
                async for item in items:
                    if isinstance(item, TokenChunk):
                        if answer.rendering.stopped:
                            break  # the engine went on past the stop the client's text reached: StoppedAtEntry
                        produced.extend(item.token_ids)
                        if check == "hold":
                            held.append(item)
                            if not window or len(produced) < window:
                                continue
                            assert isinstance(action, ForwardTo)
                            verdict = await self._check_answer(action.peer, run_tokens, produced, params, deadline, final=False)
                            if verdict is not None and not verdict.ok:
                                rejected = verdict
                                break
                            # The window passed: it goes out, the rest streams and the
                            # whole answer is checked at its end (the probation verdict).
                            check = "after"
                            attempt.held_tokens = len(produced)
                            for chunk in held:
                                generated += len(chunk.token_ids)
                                yield answer.accept(chunk)
                            held = []
                            continue
                        generated += len(item.token_ids)
                        yield answer.accept(item)
                    elif isinstance(item, Done):
                        record = item.record
                    else:
                        record = item
            verdict = rejected
            done: AttemptDone | StoppedAtEntry | None = None
            if rejected is None:
                # No record: the loop above left the stream at a stop the engine did not see.
                done = AttemptDone(record.reused_tokens, generated) if record is not None else StoppedAtEntry(generated)
                if check != "none" and produced:
                    assert isinstance(action, ForwardTo)
                    verdict = await self._check_answer(action.peer, run_tokens, produced, params, deadline, spot=spot)
            event, release = self._settle_check(attempt, check, verdict, done, held, len(produced), record, generated)
            for chunk in held[:release]:
                generated += len(chunk.token_ids)
                yield answer.accept(chunk)
            if isinstance(event, (AttemptDone, StoppedAtEntry)):
                event = replace(event, generated=generated)  # the released held chunks count too
            else:
                record = None
        except RemoteError as exc:
            event = Refused(exc.code, exc.message, generated)
            self._on_refusal(action, exc)
        except ForwardFailed as exc:
            event = PeerLost(str(exc), generated)
            self.counters.forward_failures += 1
            self.counters.fallbacks += 1
            log.info("forward to %s lost: %s", attempt.target, exc)
        except EngineOverloadedError as exc:
            event = Refused("BUSY", str(exc), generated)
            self.counters.fallbacks += 1
        except DeadlineExceeded as exc:
            event = DeadlinePassed(str(exc))
        if not attempt.local:
            attempt.path = facts.get("path")  # type: ignore[assignment]
            attempt.stream_bytes = int(facts.get("stream_bytes", 0))  # type: ignore[call-overload]
        yield _TryEnded(event, record)

    async def _in_vocabulary(self, source: AsyncIterator[TokenChunk | Done], peer: str) -> AsyncIterator[TokenChunk | Done]:
        """A peer's answer, ended as garbage at its first token id outside this node's vocabulary.

        The client's text is rendered from the ids (:class:`_Answer`), so every
        id must have bytes here; the peer's own text is ignored."""
        vocab = self.engine.vocab_size
        async with aclosing(source) as items:
            async for item in items:
                if isinstance(item, TokenChunk):
                    bad = next((t for t in item.token_ids if type(t) is not int or not 0 <= t < vocab), None)
                    if bad is not None:
                        raise ForwardFailed(f"malformed answer from {peer}: token id {bad!r} is outside the vocabulary "
                                            f"(0..{vocab - 1})", started=True)
                yield item

    def _settle_check(
        self,
        attempt: Attempt,
        check: CheckPlan,
        verdict: Verdict | None,
        done: AttemptDone | StoppedAtEntry | None,
        held: list[TokenChunk],
        produced: int,
        record: GenerationRecord | None,
        generated: int,
    ) -> tuple[Event, int]:
        """The try's event after its answer check (``verdict``; None: no check, or it could
        not run), and how many held chunks go to the client. ``done``: the event had the
        answer not been checked (None when a held window was rejected)."""
        release = len(held)
        if held:
            attempt.held_tokens = produced
        event: Event | None = done
        if verdict is None:
            if check != "none" and produced:
                attempt.check = "error"
        elif verdict.ok:
            attempt.check = "passed"
        elif check == "hold":
            attempt.check = "rejected"
            release, kept = 0, 0  # whole chunks only, up to the last verified token
            while release < len(held) and kept + len(held[release].token_ids) <= verdict.verified_tokens:
                kept += len(held[release].token_ids)
                release += 1
            event = Rejected(kept, verdict.reason)
        else:
            attempt.check = "failed_after_streaming"
            event = AttemptDone(record.reused_tokens if record else 0, generated, wrong=verdict.reason)
        if attempt.check:
            self.counters.answers_checked[attempt.check] += 1
        assert event is not None
        return event, release

    def _result(
        self,
        life: RequestAttempts,
        decision: Decision,
        decision_s: float,
        tokens: list[int],
        hashes: Sequence[int],
        answer: _Answer,
        record: GenerationRecord | None,
        request_id: bytes,
        prefer: str | None,
    ) -> GenerateResult:
        """The request's result once its lifecycle finished; counted and logged for the dashboard."""
        served = life.current
        total = time.perf_counter() - answer.t0
        if record is None or served.outcome != "done":  # every token arrived, the final record did not
            finish = "stop" if answer.rendering.stopped else "length"
            record = GenerationRecord(len(tokens), 0, len(answer.tokens), answer.ttft or total, total, finish)
        if served.local:
            self.counters.served_local += 1
        else:
            self.counters.served_remote += 1
            self.counters.served_by_path[served.path or "unknown"] += 1
        attempts = life.attempts
        reason = decision.reason
        if len(attempts) > 1:
            reason += f"; served by attempt {len(attempts)} after " + ", ".join(
                f"{a.target[:12]} {a.outcome}" for a in attempts[:-1]
            )
        if prefer:
            reason = f"preferred {prefer[:12]}; " + reason
        ttft = answer.ttft if answer.ttft is not None else total
        self._log_decision(tokens, hashes, decision, attempts, outcome="ok", total_s=total, reason=reason,
                           target=served.target, local=served.local, predicted=served.predicted_reused_tokens,
                           reused=record.reused_tokens, generated=len(answer.tokens), ttft_s=ttft,
                           request_id=request_id.hex())
        return GenerateResult(
            request_id=request_id.hex(),
            served_by=served.target,
            served_locally=served.local,
            hops=0 if served.local else 1,
            policy=decision.policy,
            reason=reason,
            predicted_reused_tokens=served.predicted_reused_tokens,
            reused_tokens=record.reused_tokens,
            prompt_tokens=len(tokens),
            generated_tokens=len(answer.tokens),
            token_ids=answer.tokens,
            text="".join(answer.text),
            finish_reason=record.finish_reason,
            ttft_s=ttft,
            total_s=total,
            record=record,
            attempts=attempts,
            decision=decision,
            model=self.router.fingerprint_hex,
            logprobs=answer.logprobs,
            path=served.path,
            decision_s=decision_s,
        )

    async def complete(self, prompt: Prompt, params: GenerationParams | None = None, **kwargs: Any) -> GenerateResult:
        """:meth:`generate` without the stream: just the result."""
        async with aclosing(self.generate(prompt, params, **kwargs)) as items:
            async for item in items:
                if isinstance(item, GenerateResult):
                    return item
        raise NodeError("generation ended without a result")  # pragma: no cover

    def _log_decision(self, tokens: list[int], hashes: Sequence[int], decision: Decision, attempts: Sequence[Any], *,
                      outcome: str, total_s: float, reason: str, target: str | None = None, local: bool = False,
                      predicted: int = 0, reused: int = 0, generated: int = 0, ttft_s: float | None = None,
                      request_id: str = "") -> None:
        """One line of the dashboard's routing feed (:mod:`.decisions`); never fails the request."""
        try:
            group = None
            if target is not None:
                group = self.prefix_groups.note(tokens, hashes, target, reused, self._group_label, time.time())
            self.decisions.append({
                "request_id": request_id,
                "entry": self.peer_id,
                "target": target,
                "local": local,
                "outcome": outcome,
                "policy": decision.policy,
                "reason": reason,
                "predicted_reused_tokens": predicted,
                "reused_tokens": reused,
                "prompt_tokens": len(tokens),
                "generated_tokens": generated,
                "ttft_ms": None if ttft_s is None else round(ttft_s * 1000, 3),
                "total_ms": round(total_s * 1000, 3),
                "attempts": [f"{a.target[:16]} {a.outcome}" for a in attempts],
                "group": group.key if group else None,
                "group_label": group.label if group else None,
            })
        except Exception:  # bookkeeping for a page must never break serving
            log.exception("could not log a routing decision")

    def _group_label(self, head: Sequence[int]) -> str:
        try:
            return prompt_label(self.engine.detokenize(head))
        except Exception:  # noqa: BLE001 - a label is cosmetic
            return f"{len(head)} tokens"

    async def _generate_elsewhere(
        self, fingerprint: str, prompt: Prompt, params: GenerationParams, timeout_s: float | None
    ) -> AsyncIterator[TokenChunk | GenerateResult]:
        """A request for a model this node does not serve: forward only.

        This node cannot tokenise for that model, so it sends the text (or
        the chat messages) to one of the model's nodes
        (:meth:`SwarmModels.delegates`), which routes it by prefix among its
        model's nodes as if it had entered there. No local fallback; a
        delegate that fails before its first token is replaced by the next.
        """
        params.validate()
        alias = self.swarm_models.alias_of(fingerprint)
        text, messages = _delegated_prompt(prompt)
        self.counters.requests += 1
        t0 = time.perf_counter()
        deadline = trio.current_time() + (timeout_s or self.config.request_timeout_s)
        request_id = secrets.token_bytes(16)
        limit = self.router.config.max_attempts
        peers = self.swarm_models.delegates(fingerprint, time.monotonic(), self._rng, limit)
        if not peers:
            self.counters.requests_failed += 1
            raise ModelUnavailable(f"no node of the swarm serves model {alias!r} (fingerprint {fingerprint}) right now")
        attempts: list[Attempt] = []
        out: list[int] = []
        text_out: list[str] = []
        logprobs: list[Any] = []
        ttft: float | None = None
        for peer in peers:
            attempt = Attempt(peer, False, 0)
            attempts.append(attempt)
            wire = encode_request(
                request_id=request_id, tokens=(), params=params, hops=1,
                deadline_ms=int(max(0.0, deadline - trio.current_time()) * 1000) or 1,
                fingerprint=fingerprint, predicted_match_tokens=0, origin=self.peer_id,
                prompt_text=text, messages=messages, tools_json=params_tools_json(prompt),
            )
            done: Done | None = None
            try:
                async with aclosing(self.forward_client.stream(peer, wire, deadline=deadline)) as items:
                    async for item in items:
                        if isinstance(item, TokenChunk):
                            if ttft is None:
                                ttft = time.perf_counter() - t0
                            out.extend(item.token_ids)
                            text_out.append(item.text)
                            logprobs.extend(item.logprobs)
                            attempt.generated_tokens += len(item.token_ids)
                            yield item
                        else:
                            done = item
            except RemoteError as exc:
                attempt.outcome, attempt.message = exc.code, exc.message
                self.counters.refusals_received[exc.code] += 1
                if exc.code == "BAD_REQUEST":
                    raise InvalidRequestError(f"{alias}: {exc.message}") from None
                if exc.code == "TOO_LARGE":
                    raise PromptTooLongError(f"{alias}: {exc.message}") from None
                if exc.code == "DEADLINE":
                    raise DeadlineExceeded(exc.message) from None
                if exc.code == "BUSY":
                    self.swarm_models.mark_busy(peer, time.monotonic(), self.router.config.busy_backoff_s)
                elif exc.code == "MODEL_MISMATCH":
                    self.swarm_models.forget(peer)
            except ForwardFailed as exc:
                attempt.outcome, attempt.message = "failed", str(exc)
                self.counters.forward_failures += 1
                self.swarm_models.forget(peer)
            if done is None:
                if out:  # the text is the delegate's to continue; nobody else holds its tokens
                    self.counters.requests_failed += 1
                    raise RequestFailed(f"the node serving model {alias!r} was lost mid-answer: {attempt.message}", attempts)
                self.counters.fallbacks += 1
                continue
            record = done.record
            attempt.outcome, attempt.reused_tokens = "done", record.reused_tokens
            self.counters.served_remote += 1
            total = time.perf_counter() - t0
            reason = f"model {alias!r} is not served here; delegated to {peer[:12]}, which routes among its model's nodes"
            if len(attempts) > 1:
                reason += "; after " + ", ".join(f"{a.target[:12]} {a.outcome}" for a in attempts[:-1])
            yield GenerateResult(
                request_id=request_id.hex(), served_by=done.served_by or peer, served_locally=False,
                hops=1 if (done.served_by or peer) == peer else 2, policy="delegate", reason=reason,
                predicted_reused_tokens=0, reused_tokens=record.reused_tokens, prompt_tokens=record.prompt_tokens,
                generated_tokens=len(out), token_ids=out, text="".join(text_out), finish_reason=record.finish_reason,
                ttft_s=ttft if ttft is not None else total, total_s=total, record=record, attempts=attempts,
                model=fingerprint, logprobs=logprobs,
            )
            return
        self.counters.requests_failed += 1
        tried = ", ".join(f"{a.target[:12]} {a.outcome} {a.message[:80]}" for a in attempts)
        if all(a.outcome in ("failed", "MODEL_MISMATCH") for a in attempts):
            # Every node it was announced on is gone (or runs something else now).
            raise ModelUnavailable(f"no node of the swarm serves model {alias!r} (fingerprint {fingerprint}) right now: {tried}")
        raise RequestFailed(f"every node tried for model {alias!r} refused or failed: {tried}", attempts)

    async def serve_delegated(self, req: Request, deadline: float) -> AsyncIterator[TokenChunk | Done]:
        """A delegated request (``ForwardServer`` calls this): route it as if it entered here."""
        prompt: Prompt = req.prompt_text or [{"role": m.role, "content": m.content} for m in req.messages]
        tools = _tools_from_json(req.tools_json) if req.tools_json else None
        if tools is not None:
            prompt = ToolPrompt(prompt, tools)  # type: ignore[arg-type]
        try:
            async with aclosing(self.generate(prompt, req.params, timeout_s=max(0.001, deadline - trio.current_time()))) as items:
                async for item in items:
                    if isinstance(item, GenerateResult):
                        yield Done(item.record, item.served_by)
                    else:
                        yield item
        except RequestFailed as exc:
            if any(a.outcome == "BUSY" for a in exc.attempts):
                raise EngineOverloadedError(str(exc)) from None
            raise EngineError(str(exc)) from None
        except NodeError as exc:
            raise InvalidRequestError(str(exc)) from None

    def _check_plan(self, peer: str, params: GenerationParams) -> CheckPlan:
        """Whether this forward's answer is checked, and how (:class:`SpotChecks`)."""
        if not self.engine.can_score or checkable(params) is not None:
            return "none"
        return self.spot_checks.plan(peer)

    async def _check_answer(
        self, peer: str, prompt: list[int], answer: list[int], params: GenerationParams, deadline: float,
        *, final: bool = True, spot: bool = False,
    ) -> Verdict | None:
        """Check ``answer`` after ``prompt``: a spot check on a third peer holding
        more of the prompt's prefix when there is one (:meth:`_check_elsewhere`),
        else on this node's engine. ``None`` when the check could not run (the
        answer then passes unchecked). ``final=False``: a probation window, whose
        pass is not yet a passed answer (only the check of the whole answer counts
        towards probation). ``spot``: a spot check, whose tokens count against the
        checks' budget."""
        answer = answer[: self.spot_checks.config.max_checked_tokens]
        if spot and self.spot_checks.config.delegate:
            verifier = self._verifier_for(peer, prompt)
            if verifier is not None:
                verdict = await self._check_elsewhere(verifier, peer, prompt, answer, params, deadline)
                if verdict is not None:
                    return verdict
        return await self._check_here(peer, prompt, answer, params, deadline, final=final, spot=spot)

    def _verifier_for(self, peer: str, prompt: list[int]) -> str | None:
        """The peer to ask for a spot check's scores (:func:`~p2pinfer.core.verify.pick_verifier`)."""
        view = self.router.view
        block = self.router.hasher.block_size
        now = time.monotonic()

        def candidate(other: str) -> PeerState | None:
            state = view.get(other)
            if (state is None or not view.eligible(state, now) or self.sanctions.is_distrusted(other)
                    or self.spot_checks.on_probation(other)):
                return None
            return state

        matches = view.longest_matches(self.router.hasher.hashes(prompt))
        own = self.engine.cache.match(prompt, touch=False) // block
        return pick_verifier(matches, own, candidate, {peer, self.peer_id})

    async def _check_elsewhere(
        self, verifier: str, peer: str, prompt: list[int], answer: list[int], params: GenerationParams, deadline: float,
    ) -> Verdict | None:
        """A spot check scored by ``verifier`` and judged here; ``None`` when it
        could not be asked (the caller checks here instead). A failed verdict is
        confirmed on this node's engine before ``peer`` is sanctioned: if this
        node's check passes, the verifier's scores were wrong and the verifier is
        distrusted instead (so a lying verifier cannot frame an honest peer)."""
        greedy = params.temperature <= 0.0
        t0 = time.perf_counter()
        # Half the time left: a verifier that hangs must leave time to check here.
        ask_by = trio.current_time() + max(0.0, deadline - trio.current_time()) / 2
        try:
            got = await self.checker.ask(verifier, prompt, answer, 1.0 if greedy else params.temperature, deadline=ask_by)
        except (CheckUnavailable, RemoteError) as exc:
            self.counters.checks_delegated["fallback"] += 1
            log.info("spot check by %s not available (%s): checking here", verifier, exc)
            return None
        except WireError as exc:
            self._verifier_lied(verifier, f"its check answer was malformed: {exc.message}")
            return None
        finally:
            self.counters.check_seconds += time.perf_counter() - t0
        self.spot_checks.note_spot_check(got.evaluated_tokens)
        verdict = judge(got.scores, params, self.spot_checks.config)
        if verdict.ok:
            self.counters.checks_delegated["passed"] += 1
            self.spot_checks.record(peer, verdict)
            return verdict
        here = await self._check_here(peer, prompt, answer, params, deadline, spot=True)
        if here is None:
            self.counters.checks_delegated["fallback"] += 1
            return None  # unconfirmed: nobody is sanctioned on one peer's word
        if here.ok:
            self._verifier_lied(verifier, f"its scores failed an answer this node's check passed: {verdict.reason}")
        else:
            self.counters.checks_delegated["failed"] += 1
        return here

    def _verifier_lied(self, verifier: str, reason: str) -> None:
        """A verifier's scores could not be real: distrusted as a peer returning wrong tokens is."""
        self.counters.checks_delegated["verifier_wrong"] += 1
        self.counters.peers_distrusted += 1
        self.router.on_wrong_answer(verifier, time.monotonic())
        self.sanctions.distrust(verifier, f"it returned wrong scores for a check: {reason}")
        self.spot_checks.restart_probation(verifier)

    async def _check_here(
        self, peer: str, prompt: list[int], answer: list[int], params: GenerationParams, deadline: float,
        *, final: bool = True, spot: bool = False,
    ) -> Verdict | None:
        """Score ``answer`` after ``prompt`` on this node's engine and judge it
        (see :meth:`_check_answer`)."""
        config = self.spot_checks.config
        greedy = params.temperature <= 0.0
        if spot:
            self.spot_checks.note_spot_check(len(prompt) - self.engine.cache.match(prompt, touch=False) + len(answer))
        t0 = time.perf_counter()
        scores = None
        try:
            with trio.move_on_at(deadline):
                scores = await self.engine.score(prompt + answer, len(prompt), temperature=1.0 if greedy else params.temperature)
        except (EngineError, NotImplementedError) as exc:
            log.warning("could not check the answer of %s: %s", peer, exc)
        finally:
            self.counters.check_seconds += time.perf_counter() - t0
        if scores is None:
            return None
        self.counters.tokens_checked += len(prompt) + len(answer)
        verdict = judge(scores, params, config)
        self.spot_checks.record(peer, verdict, window=not final)
        if not verdict.ok:
            log.warning("answer of %s failed its check: %s", peer, verdict.reason)
        return verdict

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
                if isinstance(item, GenerationRecord):  # the work a spot check's budget is a share of
                    self.spot_checks.note_served(item.prompt_tokens - item.reused_tokens + item.generated_tokens)
                yield item
        finally:
            try:
                await items.aclose()
            finally:
                self.router.end_serving(in_service)


def _delegated_prompt(prompt: Prompt) -> tuple[str, tuple[ChatLine, ...]]:
    """What a delegated request carries: text or messages (token ids are the serving model's)."""
    if isinstance(prompt, ToolPrompt):
        prompt = prompt.messages
    if isinstance(prompt, str):
        return prompt, ()
    items = list(prompt)
    if items and all(isinstance(m, Mapping) for m in items):
        lines = []
        for i, m in enumerate(items):
            role, content = m.get("role"), m.get("content")  # type: ignore[union-attr]
            if not isinstance(role, str) or not isinstance(content, str):
                raise InvalidRequestError(f"message {i} needs string 'role' and 'content'")
            lines.append(ChatLine(role, content))
        return "", tuple(lines)
    raise NodeError("token ids cannot be sent for a model this node does not serve (they are that model's tokenizer's); send text or messages")


def params_tools_json(prompt: Prompt) -> str:
    """The ``tools`` a delegated chat request carries for the serving model's template."""
    return json.dumps(list(prompt.tools), separators=(",", ":")) if isinstance(prompt, ToolPrompt) else ""


def _tools_from_json(raw: str) -> list[dict[str, Any]]:
    try:
        tools = json.loads(raw)
    except (json.JSONDecodeError, RecursionError):
        raise InvalidRequestError("tools_json is not valid JSON") from None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise InvalidRequestError("tools_json must be a list of objects")
    return tools
