"""The OpenAI-compatible HTTP API of a node (starlette, served by hypercorn on trio).

Any node accepts any request and routes it through the swarm with
:meth:`p2pinfer.node.Node.generate`. Every response carries a ``p2pinfer``
extension field with the routing facts: who served it, predicted and
realised reused tokens, the reason, hops and the attempts. Errors use the
OpenAI error object: 400 for a bad request, 413 for one too large, 503 with
``Retry-After`` when the swarm is saturated, 504 past the deadline. The
live dashboard's routes come from :mod:`.dashboard`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import aclosing
import json
import logging
import time
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
import trio
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..engines.base import EngineError, EngineOverloadedError, InvalidRequestError, PromptTooLongError, TokenChunk, TokenLogprob
from .auth import ApiKeys, AuthMiddleware
from .dashboard import dashboard_routes
from .metrics import NodeMetrics
from .sessions import DashboardSessions
from .openai_schema import (
    MAX_BODY_BYTES,
    ApiError,
    ChatRequest,
    CompletionRequest,
    error_body,
    new_id,
    now_s,
    parse_chat,
    parse_completion,
    parse_json_body,
)
from .structured import ToolCall, parse_tool_call

if TYPE_CHECKING:
    from ..node import GenerateResult, Node

__all__ = ["ApiLimits", "create_app"]

log = logging.getLogger(__name__)


class ApiLimits:
    """Admission control: more concurrent requests than this get 503."""

    def __init__(self, max_concurrent: int = 128, retry_after_s: int = 2) -> None:
        self.max_concurrent = max_concurrent
        self.retry_after_s = retry_after_s
        self.active = 0


def _routing_facts(result: GenerateResult) -> dict[str, Any]:
    return {
        "request_id": result.request_id,
        "served_by": result.served_by,
        "served_locally": result.served_locally,
        "hops": result.hops,
        "path": result.path,
        "policy": result.policy,
        "reason": result.reason,
        "predicted_reused_tokens": result.predicted_reused_tokens,
        "reused_tokens": result.reused_tokens,
        "prompt_tokens": result.prompt_tokens,
        "ttft_ms": round(result.ttft_s * 1000, 3),
        # The serving engine's own timing: waiting for it, then restore + prefill to the first token.
        "engine_queue_ms": round(result.record.queue_s * 1000, 3),
        "engine_prefill_ms": round(max(0.0, result.record.ttft_s - result.record.queue_s) * 1000, 3),
        # No reply save time: the reply is saved after the answer ends (the node's /status and /metrics count it).
        "attempts": [a.as_dict() for a in result.attempts],
    }


def _usage(result: GenerateResult) -> dict[str, int]:
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.generated_tokens,
        "total_tokens": result.prompt_tokens + result.generated_tokens,
        "prompt_tokens_details": {"cached_tokens": result.reused_tokens},  # type: ignore[dict-item]
    }


def _error_response(err: ApiError) -> JSONResponse:
    headers = {}
    if err.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, int(round(err.retry_after_s))))
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


def _translate(exc: BaseException, limits: ApiLimits) -> ApiError:
    """Map what the node raised to the HTTP answer."""
    from ..node import DeadlineExceeded, ModelUnavailable, RequestFailed

    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ModelUnavailable):
        return ApiError(503, str(exc), type="server_error", param="model", code="model_unavailable",
                        retry_after_s=limits.retry_after_s)
    if isinstance(exc, PromptTooLongError):
        return ApiError(413, str(exc), code="context_length_exceeded", param="prompt")
    if isinstance(exc, InvalidRequestError):
        return ApiError(400, str(exc))
    if isinstance(exc, EngineOverloadedError):
        return ApiError(503, f"the swarm is saturated: {exc}", type="server_error", code="overloaded",
                        retry_after_s=limits.retry_after_s)
    if isinstance(exc, RequestFailed):
        if any(a.outcome == "BUSY" for a in exc.attempts):
            return ApiError(503, f"the swarm is saturated: {exc}", type="server_error", code="overloaded",
                            retry_after_s=limits.retry_after_s)
        return ApiError(502, str(exc), type="server_error", code="no_peer_could_serve")
    if isinstance(exc, DeadlineExceeded):
        return ApiError(504, str(exc), type="server_error", code="deadline_exceeded")
    if isinstance(exc, EngineError):
        return ApiError(500, f"engine failure: {exc}", type="server_error", code="engine_error")
    log.exception("unexpected error while serving a request", exc_info=exc)
    return ApiError(500, f"internal error: {type(exc).__name__}: {exc}", type="server_error", code="internal")


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


NOT_READY = object()
"""What :meth:`_Stream.next_nowait` returns when the next item has not arrived yet."""


class _Stream:
    """The consumer side of a generation: items in order, errors re-raised."""

    def __init__(self, recv: trio.MemoryReceiveChannel[Any], scope: trio.CancelScope) -> None:
        self._recv = recv
        self._scope = scope

    async def next(self) -> Any:
        try:
            item = await self._recv.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None
        if isinstance(item, _Failure):
            raise item.exc
        return item

    def next_nowait(self) -> Any:
        """The next item if it is already here, else :data:`NOT_READY`; raises as :meth:`next` does."""
        try:
            item = self._recv.receive_nowait()
        except trio.WouldBlock:
            return NOT_READY
        except trio.EndOfChannel:
            raise StopAsyncIteration from None
        if isinstance(item, _Failure):
            raise item.exc
        return item

    async def aclose(self) -> None:
        self._scope.cancel()
        await self._recv.aclose()


Spawn = Callable[..., None]


class _OpenAIRoutes:
    """The API's request handlers over one node: body limits, model names,
    admission, and the producer task that drives a generation for a response."""

    def __init__(self, node: Node, spawn: Spawn, metrics: NodeMetrics, limits: ApiLimits) -> None:
        self.node = node
        self.spawn = spawn
        self.metrics = metrics
        self.limits = limits

    @staticmethod
    async def read_body(request: Request) -> dict[str, Any]:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            raise ApiError(413, f"request body of {declared} bytes exceeds {MAX_BODY_BYTES}", code="body_too_large")
        raw = bytearray()
        try:
            async for piece in request.stream():
                raw += piece
                if len(raw) > MAX_BODY_BYTES:
                    raise ApiError(413, f"request body exceeds {MAX_BODY_BYTES} bytes", code="body_too_large")
        except ClientDisconnect:
            raise ApiError(400, "client disconnected while sending the body") from None
        return parse_json_body(bytes(raw))

    def resolve_model(self, model: str | None) -> str:
        """The fingerprint the request's ``model`` names (alias or fingerprint); 404 if the swarm has none."""
        node = self.node
        if model in (None, "", "default"):
            return node.router.fingerprint_hex
        found = node.swarm_models.resolve(model, time.monotonic())
        if found is None:
            served = ", ".join(repr(m.alias) for m in node.swarm_models.models(time.monotonic()))
            raise ApiError(404, f"model {model!r} is not served by this swarm (it serves {served})",
                           param="model", code="model_not_found")
        return found

    def admit(self) -> None:
        limits = self.limits
        if limits.active >= limits.max_concurrent:
            raise ApiError(503, f"this node has {limits.active} requests in flight (limit {limits.max_concurrent})",
                           type="server_error", code="overloaded", retry_after_s=limits.retry_after_s)

    async def run(self, prompt: Any, req: CompletionRequest | ChatRequest, model: str,
                  channel: trio.MemorySendChannel[Any], scope: trio.CancelScope) -> None:
        """Producer task: drives the node's stream into ``channel``.

        It runs in the server's nursery, not in the response's task, because
        the node's stream holds trio cancel scopes that must be entered and
        left by one task. The consumer cancels ``scope`` when the client
        goes away, which closes the node's stream and frees the engine.
        """
        limits, metrics = self.limits, self.metrics
        limits.active += 1
        outcome = "error"
        try:
            with scope:
                async with aclosing(self.node.generate(prompt, req.params, model=model)) as items:
                    async for item in items:
                        if not isinstance(item, TokenChunk):
                            outcome = "ok"
                            metrics.observe(
                                outcome="ok", ttft_s=item.ttft_s, forwarded=not item.served_locally,
                                predicted=item.predicted_reused_tokens, realised=item.reused_tokens,
                                prompt_tokens=item.prompt_tokens,
                            )
                        try:
                            channel.send_nowait(item)  # no extra trip through trio's scheduler per token
                        except trio.WouldBlock:
                            await channel.send(item)
            if scope.cancelled_caught and outcome != "ok":
                outcome = "cancelled"
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            if outcome != "ok":
                outcome = "cancelled"  # the client went away
        except Exception as exc:  # noqa: BLE001 - handed to the consumer
            outcome = _outcome_label(type(exc).__name__)
            with trio.move_on_after(5):
                try:
                    await channel.send(_Failure(exc))
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
        finally:
            channel.close()
            limits.active -= 1
            if outcome != "ok":
                metrics.observe(outcome=outcome)

    async def start(self, prompt: Any, req: CompletionRequest | ChatRequest, model: str) -> _Stream:
        send, recv = trio.open_memory_channel[Any](64)
        scope = trio.CancelScope()
        self.spawn(self.run, prompt, req, model, send, scope)
        return _Stream(recv, scope)

    async def respond(self, request: Request, kind: str) -> Response:
        try:
            body = await self.read_body(request)
            req: CompletionRequest | ChatRequest = parse_completion(body) if kind == "text" else parse_chat(body)
            model = self.resolve_model(req.model)
            self.admit()
            prompt: Any = req.prompt if isinstance(req, CompletionRequest) else list(req.messages)
            if isinstance(req, ChatRequest) and req.tools is not None and req.tools.choice != "none":
                from ..node import ToolPrompt

                prompt = ToolPrompt(prompt, req.tools.tools)  # the template (or an instruction) shows them
            stream = await self.start(prompt, req, model)
            try:
                first = await stream.next()
            except BaseException:
                await stream.aclose()
                raise
        except Exception as exc:  # noqa: BLE001 - every failure becomes an OpenAI error
            return _error_response(_translate(exc, self.limits))
        name = self.node.swarm_models.alias_of(model)
        if req.stream:
            return StreamingResponse(
                _sse(stream, first, kind, name, self.limits, req),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        return await _whole(stream, first, kind, name, self.limits, req)

    async def completions(self, request: Request) -> Response:
        return await self.respond(request, "text")

    async def chat(self, request: Request) -> Response:
        return await self.respond(request, "chat")

    async def models(self, request: Request) -> Response:
        """Every model the swarm serves now, with how many nodes serve it (this one included)."""
        data = []
        for m in self.node.swarm_models.models(time.monotonic()):
            facts: dict[str, Any] = {"fingerprint": m.fingerprint, "nodes": m.nodes, "served_here": m.served_here}
            if m.served_here:
                facts["engine"] = self.node.engine.name
            data.append({"id": m.alias, "object": "model", "created": 0, "owned_by": "p2pinfer", "p2pinfer": facts})
        return JSONResponse({"object": "list", "data": data})

    async def status(self, request: Request) -> Response:
        return JSONResponse(self.node.status())

    async def prometheus(self, request: Request) -> Response:
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def health(self, request: Request) -> Response:
        if (why := self.node.engine.failure) is not None:  # the process is up, but it cannot serve
            return JSONResponse({"ok": False, "peer_id": self.node.peer_id, "error": why}, status_code=503)
        return JSONResponse({"ok": True, "peer_id": self.node.peer_id})


async def _not_found(request: Request, exc: Exception) -> Response:
    return JSONResponse(error_body(f"no route {request.method} {request.url.path}", "invalid_request_error",
                                   code="not_found"), status_code=404)


async def _method_not_allowed(request: Request, exc: Exception) -> Response:
    return JSONResponse(error_body(f"{request.method} is not allowed on {request.url.path}",
                                   "invalid_request_error", code="method_not_allowed"), status_code=405)


def create_app(
    node: Node,
    spawn: Spawn,
    metrics: NodeMetrics | None = None,
    limits: ApiLimits | None = None,
    keys: ApiKeys | None = None,
) -> Starlette:
    """``spawn(fn, *args)`` starts a task in a nursery that outlives requests.

    With ``keys``, every route needs ``Authorization: Bearer <key>`` (or the
    dashboard's session cookie) except the keys' open routes (:mod:`.auth`)."""
    limits = limits or ApiLimits()
    metrics = metrics or NodeMetrics(lambda: metrics_snapshot(node))
    api = _OpenAIRoutes(node, spawn, metrics, limits)
    sessions = DashboardSessions() if keys is not None and keys.enabled else None
    app = Starlette(
        routes=[
            *dashboard_routes(node, spawn, keys, sessions),
            Route("/v1/completions", api.completions, methods=["POST"]),
            Route("/v1/chat/completions", api.chat, methods=["POST"]),
            Route("/v1/models", api.models, methods=["GET"]),
            Route("/status", api.status, methods=["GET"]),
            Route("/metrics", api.prometheus, methods=["GET"]),
            Route("/health", api.health, methods=["GET"]),
        ],
        exception_handlers={404: _not_found, 405: _method_not_allowed},
        middleware=[Middleware(AuthMiddleware, keys=keys, sessions=sessions)] if sessions is not None else [],
    )
    app.state.metrics = metrics
    app.state.limits = limits
    return app


def _outcome_label(exc_name: str) -> str:
    return {
        "RequestFailed": "failed",
        "DeadlineExceeded": "deadline",
        "PromptTooLongError": "too_large",
        "InvalidRequestError": "bad_request",
        "EngineOverloadedError": "overloaded",
    }.get(exc_name, "error")


def _piece_text(piece: bytes) -> str:
    return piece.decode("utf-8", errors="replace")


def _chat_logprobs(items: Sequence[TokenLogprob]) -> dict[str, Any]:
    """OpenAI's chat ``logprobs``: one entry per generated token."""
    return {
        "content": [
            {
                "token": _piece_text(lp.piece), "logprob": lp.logprob, "bytes": list(lp.piece),
                "top_logprobs": [{"token": _piece_text(b), "logprob": v, "bytes": list(b)} for _, b, v in lp.top],
            }
            for lp in items
        ],
        "refusal": None,
    }


def _completion_logprobs(items: Sequence[TokenLogprob], offset: int, top: bool) -> dict[str, Any]:
    """OpenAI's (legacy) completions ``logprobs``; ``offset``: characters of text before these tokens."""
    tokens = [_piece_text(lp.piece) for lp in items]
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t)
    return {
        "tokens": tokens,
        "token_logprobs": [lp.logprob for lp in items],
        "top_logprobs": [{_piece_text(b): v for _, b, v in lp.top} for lp in items] if top else None,
        "text_offset": offsets,
    }


def _finish_and_calls(result: GenerateResult, req: CompletionRequest | ChatRequest) -> tuple[str, ToolCall | None]:
    tools = getattr(req, "tools", None)
    call = parse_tool_call(result.text, tools) if tools is not None else None
    return ("tool_calls", call) if call is not None else (result.finish_reason, None)


async def _whole(stream: _Stream, first: Any, kind: str, model_id: str, limits: ApiLimits,
                 req: CompletionRequest | ChatRequest) -> Response:
    from ..node import GenerateResult

    item = first
    try:
        while not isinstance(item, GenerateResult):
            item = await stream.next()
    except Exception as exc:  # noqa: BLE001
        return _error_response(_translate(exc, limits))
    finally:
        await stream.aclose()
    result: GenerateResult = item
    created = now_s()
    params = req.params
    if kind == "text":
        logprobs = _completion_logprobs(result.logprobs, 0, params.top_logprobs > 0) if params.logprobs else None
        body: dict[str, Any] = {
            "id": new_id("cmpl"), "object": "text_completion", "created": created, "model": model_id,
            "choices": [{"index": 0, "text": result.text, "logprobs": logprobs, "finish_reason": result.finish_reason}],
        }
    else:
        finish, call = _finish_and_calls(result, req)
        message: dict[str, Any] = {"role": "assistant", "content": result.text}
        if call is not None:
            message = {"role": "assistant", "content": None, "tool_calls": [call.as_dict()]}
        body = {
            "id": new_id("chatcmpl"), "object": "chat.completion", "created": created, "model": model_id,
            "choices": [{"index": 0, "message": message,
                         "logprobs": _chat_logprobs(result.logprobs) if params.logprobs else None,
                         "finish_reason": finish}],
        }
    body["usage"] = _usage(result)
    body["p2pinfer"] = _routing_facts(result)
    return JSONResponse(body)


async def _sse(stream: _Stream, first: Any, kind: str, model_id: str, limits: ApiLimits,
               req: CompletionRequest | ChatRequest) -> AsyncIterator[bytes]:
    """Server-sent events in OpenAI's format, ending with ``data: [DONE]``.

    An error after the first byte cannot change the status code, so it is
    sent as an ``error`` event (what OpenAI clients raise on). With tools
    the model may call, the answer is held back until it ends: only then is
    it known to be a call (one ``tool_calls`` delta) or text (one content
    delta). ``stream_options.include_usage`` adds OpenAI's last chunk with
    no choices and the usage.
    """
    from ..node import GenerateResult

    rid = new_id("cmpl" if kind == "text" else "chatcmpl")
    created = now_s()
    obj = "text_completion" if kind == "text" else "chat.completion.chunk"
    params = req.params
    tools = getattr(req, "tools", None)
    hold = tools is not None and tools.grammar is not None
    offset = 0

    def event(payload: dict[str, Any]) -> bytes:
        return _sse_event(payload)

    def chunk(text: str | None, finish: str | None, role: bool = False, logprobs: Sequence[TokenLogprob] = (),
              calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        nonlocal offset
        if kind == "text":
            lp = _completion_logprobs(logprobs, offset, params.top_logprobs > 0) if params.logprobs and logprobs else None
            offset += len(text or "")
            choice: dict[str, Any] = {"index": 0, "text": text or "", "logprobs": lp, "finish_reason": finish}
        else:
            delta: dict[str, Any] = {}
            if role:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            if calls is not None:
                delta["tool_calls"] = calls
            lp = _chat_logprobs(logprobs) if params.logprobs and logprobs else None
            choice = {"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}
        return {"id": rid, "object": obj, "created": created, "model": model_id, "choices": [choice]}

    # The chunk of a token's text without logprobs, the one sent per token:
    # its bytes around the text are the same every time, so only the text is encoded.
    def text_payload(text: str) -> dict[str, Any]:
        nonlocal offset
        before = offset
        payload = chunk(text, None)
        offset = before  # the caller advances it when the chunk is sent
        return payload

    text_event = _SseTextChunk(text_payload)
    # Events of items that are already here go out together, in one write
    # (the same bytes, fewer trips through the server): see _Stream.next_nowait.
    ready: list[bytes] = []
    try:
        if kind == "chat":
            ready.append(event(chunk(None, None, role=True)))
        item = first
        held: list[Any] = []
        try:
            while True:
                if isinstance(item, GenerateResult):
                    finish = item.finish_reason
                    if hold:
                        finish, call = _finish_and_calls(item, req)
                        if call is not None:
                            ready.append(event(chunk(None, None, calls=[{"index": 0, **call.as_dict()}], logprobs=item.logprobs)))
                        elif item.text:
                            ready.append(event(chunk(item.text, None, logprobs=item.logprobs)))
                    final = chunk(None if kind == "chat" else "", finish)
                    final["usage"] = _usage(item)
                    final["p2pinfer"] = _routing_facts(item)
                    ready.append(event(final))
                    if req.include_usage:
                        ready.append(event({"id": rid, "object": obj, "created": created, "model": model_id,
                                            "choices": [], "usage": _usage(item)}))
                    break
                if hold:
                    held.append(item)
                elif params.logprobs and item.logprobs:
                    ready.append(event(chunk(item.text, None, logprobs=item.logprobs)))
                elif item.text:
                    if kind == "text":
                        offset += len(item.text)
                    ready.append(text_event(item.text))
                item = stream.next_nowait()
                if item is NOT_READY:
                    if ready:
                        yield b"".join(ready)
                        ready = []
                    item = await stream.next()
        except StopAsyncIteration:
            pass
        except Exception as exc:  # noqa: BLE001
            err = _translate(exc, limits)
            ready.append(event(err.body()))
        ready.append(b"data: [DONE]\n\n")
        yield b"".join(ready)
    finally:
        with trio.CancelScope(shield=True):
            await stream.aclose()


def _sse_event(payload: dict[str, Any]) -> bytes:
    """One server-sent event carrying ``payload`` as compact JSON."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


class _SseTextChunk:
    """``_sse_event(build(text))`` for a chunk whose only varying part is its text, encoding only the text.

    The bytes before and after the text's JSON string are taken once from
    ``build(SLOT)``, so each call is byte for byte ``_sse_event(build(text))``
    (the test checks it) at the cost of one ``json.dumps`` of a string.
    """

    SLOT = "\u2063p2pinfer-text-slot\u2063"

    def __init__(self, build: Callable[[str], dict[str, Any]]) -> None:
        self._build = build
        whole = _sse_event(build(self.SLOT))
        slot = json.dumps(self.SLOT).encode()
        self._split = whole.split(slot) if whole.count(slot) == 1 else None  # None: the slot's text is elsewhere too

    def __call__(self, text: str) -> bytes:
        if self._split is None:
            return _sse_event(self._build(text))
        head, tail = self._split
        return head + json.dumps(text).encode() + tail


def metrics_snapshot(node: Node) -> dict[str, Any]:
    """What the scrape-time collector reads from the node."""
    now = time.monotonic()
    view = node.router.view
    by_state = {"eligible": 0, "busy": 0, "distrusted": 0, "no_digest": 0}
    ages: dict[str, float | None] = {}
    for p in view:
        if p.is_distrusted(now):
            by_state["distrusted"] += 1
        elif p.backing_off(now):
            by_state["busy"] += 1
        elif view.eligible(p, now):
            by_state["eligible"] += 1
        else:
            by_state["no_digest"] += 1
        ages[p.peer_id] = p.digest_age(now)
    load = node.engine.load()
    c = node.counters
    return {
        "peers_by_state": by_state,
        "digest_ages": ages,
        "cached_tokens": node.engine.cache.total_tokens,
        "digest_hashes": len(node.router.tracker),
        "queued_prefill_tokens": load.queued_prefill_tokens,
        "gossip_bytes_sent": c.gossip_published_bytes,
        "gossip_bytes_received": c.gossip_received_bytes,
        "gossip_rejected": dict(c.gossip_rejected),
        "answers_checked": dict(c.answers_checked),
        "tokens_checked": c.tokens_checked,
        "check_seconds": c.check_seconds,
        "checks_delegated": dict(c.checks_delegated),
        "checks_served": c.checks_served,
        "peers_distrusted": c.peers_distrusted,
        "reply_saves": node.engine.reply_saves,
    }
