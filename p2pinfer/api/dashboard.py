"""The live dashboard of a node: ``/dashboard``, its files and its event stream.

The page (``static/dashboard/``: plain HTML, CSS and JavaScript, nothing
fetched from elsewhere) opens one server-sent-event stream,
``/dashboard/events``, and draws what comes down it:

``hello``
    once, on connecting: the node, the recent routing decisions and the chart history;
``snapshot``
    at most once per :attr:`DashboardHub.interval_s`: peers (graph, trust,
    busy, RTT, load), prefix groups held per peer, and one new chart point;
``decisions``
    routing decisions newer than the last ones sent, within
    :data:`DECISION_PUSH_S` of the request finishing.

One :class:`DashboardHub` per app computes each snapshot once for every open
page, and only while a page is open; at most :data:`MAX_STREAMS` streams at
a time (503 beyond). With API keys, ``/dashboard/login`` exchanges a key for
a session cookie (:mod:`.sessions`), since ``EventSource`` sends no headers.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Callable
from importlib import resources
import json
import time
from typing import TYPE_CHECKING, Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
import trio

from ..stats import percentile
from .auth import ApiKeys, session_cookie
from .openai_schema import error_body
from .sessions import COOKIE_NAME, DashboardSessions

if TYPE_CHECKING:
    from ..node import Node

__all__ = ["DashboardHub", "dashboard_routes"]

MAX_STREAMS = 16
"""Open dashboard streams per node; more get 503 (each page opens one)."""
DECISION_PUSH_S = 0.2
"""A stream sends new decisions at most this often: a burst of requests is one event, not hundreds."""
HELLO_DECISIONS = 200
SERIES_POINTS = 600
CHART_WINDOW_S = 30.0
"""Each chart point summarises the requests of the last this-many seconds."""
KEEPALIVE_S = 15.0
LOGIN_MAX_BYTES = 4096

STATIC_FILES = {
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}
PAGE_HEADERS = {
    # Everything comes from this node; nothing inline, no frames.
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
                               "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _static(name: str) -> bytes:
    return resources.files("p2pinfer.api").joinpath("static", "dashboard", name).read_bytes()


class DashboardHub:
    """Snapshots of one node, computed once for all open pages."""

    def __init__(self, node: Node, spawn: Callable[..., None], interval_s: float = 1.0) -> None:
        self.node = node
        self.spawn = spawn
        self.interval_s = interval_s
        self.streams = 0
        self.snapshot: dict[str, Any] | None = None
        self.snapshot_no = 0
        self.series: deque[dict[str, Any]] = deque(maxlen=SERIES_POINTS)
        self._running = False
        self._changed = trio.Event()
        self._last_gossip: tuple[float, int] | None = None
        node.decisions.subscribe(self._wake)

    def _wake(self) -> None:
        # Wakes every stream waiting now; later waiters wait for the next change.
        self._changed.set()
        self._changed = trio.Event()

    async def changed(self, timeout_s: float) -> None:
        """Until a new snapshot or decision, or ``timeout_s``."""
        with trio.move_on_after(timeout_s):
            await self._changed.wait()

    def ensure_running(self) -> None:
        if not self._running:
            self._running = True
            self.spawn(self._run)

    async def _run(self) -> None:
        try:
            while self.streams > 0 or self.snapshot is None:
                self.take_snapshot()
                await trio.sleep(self.interval_s)
        finally:
            self._running = False

    def take_snapshot(self) -> dict[str, Any]:
        node = self.node
        status = node.status()
        router = node.router
        groups = node.prefix_groups.holdings(
            router.view.longest_matches, node.peer_id, lambda tokens: router.cache.match(tokens, touch=False)
        )
        point = self.chart_point(groups)
        self.series.append(point)
        self.snapshot_no += 1
        self.snapshot = {
            "no": self.snapshot_no,
            "time": round(time.time(), 3),
            "node": self.describe_node(status),
            "peers": status["peers"],
            "groups": groups,
            "point": point,
        }
        self._wake()
        return self.snapshot

    def describe_node(self, status: dict[str, Any] | None = None) -> dict[str, Any]:
        status = status or self.node.status()
        c = status["counters"]
        return {
            "peer_id": status["peer_id"],
            "addrs": status["addrs"],
            "model": self.node.engine.model_name,
            "engine": status["engine"],
            "policy": status["policy"],
            "uptime_s": status["uptime_s"],
            "load": status["load"],
            "cached_tokens": self.node.engine.cache.total_tokens,
            "digest_blocks": status["digest"]["blocks"],
            "connected_peers": status["connected_peers"],
            "counters": {k: c.get(k) for k in ("requests", "requests_failed", "served_local", "served_remote",
                                               "gossip_published_bytes", "gossip_received_bytes") if k in c},
        }

    def chart_point(self, groups: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """The charts' point for now: the last :data:`CHART_WINDOW_S` of requests, gossip bytes per
        second, and how many peers hold each prefix group (at least half of it): the swarm's
        specialisation, which falls towards 1 as each group settles on one peer."""
        now = time.time()
        done = [e for e in self.node.decisions.recent(CHART_WINDOW_S, now) if e["outcome"] == "ok"]
        ttft = [e["ttft_ms"] for e in done if e["ttft_ms"] is not None]
        prompt = sum(e["prompt_tokens"] for e in done)
        reused = sum(e["reused_tokens"] for e in done)
        predicted = sum(e["predicted_reused_tokens"] for e in done)
        realised = sum(min(e["reused_tokens"], e["predicted_reused_tokens"]) for e in done)
        c = self.node.counters
        gossip = c.gossip_published_bytes + c.gossip_received_bytes
        rate = None
        if self._last_gossip is not None and now > self._last_gossip[0]:
            rate = round((gossip - self._last_gossip[1]) / (now - self._last_gossip[0]), 1)
        self._last_gossip = (now, gossip)
        copies = [sum(1 for t in g["held_tokens"].values() if 2 * t >= g["prefix_tokens"]) for g in groups or []
                  if g["prefix_tokens"]]
        return {
            "time": round(now, 3),
            "requests": len(done),
            "ttft_p50_ms": round(percentile(ttft, 50), 1) if ttft else None,
            "ttft_p99_ms": round(percentile(ttft, 99), 1) if ttft else None,
            "hit_rate": round(reused / prompt, 4) if prompt else None,
            "prediction_accuracy": round(realised / predicted, 4) if predicted else None,
            "forwarded_share": round(sum(not e["local"] for e in done) / len(done), 4) if done else None,
            "gossip_bytes_per_s": rate,
            "group_copies": round(sum(copies) / len(copies), 3) if copies else None,
        }

    async def stream(self) -> AsyncIterator[bytes]:
        """One page's events (see the module docstring)."""
        log = self.node.decisions
        self.streams += 1
        try:
            self.ensure_running()
            snapshot = self.snapshot or self.take_snapshot()
            sent_seq = log.seq
            yield _event("hello", {
                "node": snapshot["node"],
                "decisions": log.since(0, HELLO_DECISIONS),
                "series": list(self.series),
                "interval_s": self.interval_s,
                "chart_window_s": CHART_WINDOW_S,
            })
            yield _event("snapshot", snapshot)
            sent_no = snapshot["no"]
            last_sent = time.monotonic()
            while True:
                # No checkpoint between this test and the wait: no change can slip in between.
                if log.seq == sent_seq and (self.snapshot is None or self.snapshot["no"] == sent_no):
                    await self.changed(KEEPALIVE_S)
                sent = False
                if log.seq > sent_seq:
                    new = log.since(sent_seq)
                    sent_seq = log.seq
                    yield _event("decisions", new)
                    sent = True
                if self.snapshot is not None and self.snapshot["no"] != sent_no:
                    sent_no = self.snapshot["no"]
                    yield _event("snapshot", self.snapshot)
                    sent = True
                if not sent and time.monotonic() - last_sent >= KEEPALIVE_S:
                    yield b": keep-alive\n\n"
                    sent = True
                if sent:
                    last_sent = time.monotonic()
                await trio.sleep(DECISION_PUSH_S)  # the rate limit
        finally:
            self.streams -= 1


def _event(name: str, data: Any) -> bytes:
    return f"event: {name}\ndata: ".encode() + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def dashboard_routes(node: Node, spawn: Callable[..., None], keys: ApiKeys | None,
                     sessions: DashboardSessions | None, *, interval_s: float = 1.0) -> list[Route]:
    """The dashboard's routes, to add to the node's app."""
    hub = DashboardHub(node, spawn, interval_s)
    auth_required = keys is not None and keys.enabled

    async def page(request: Request) -> Response:
        return Response(_static("index.html"), media_type="text/html; charset=utf-8", headers=PAGE_HEADERS)

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in STATIC_FILES:
            return JSONResponse(error_body(f"no dashboard file {name!r}", "invalid_request_error", code="not_found"),
                                status_code=404)
        return Response(_static(name), media_type=STATIC_FILES[name], headers=PAGE_HEADERS)

    def logged_in(request: Request) -> bool:
        if not auth_required:
            return True
        token = session_cookie(request.headers.get("cookie", ""))
        return bool(token and sessions is not None and sessions.valid(token))

    async def session(request: Request) -> Response:
        return JSONResponse({"auth_required": auth_required, "authenticated": logged_in(request)})

    async def login(request: Request) -> Response:
        if not auth_required or sessions is None or keys is None:
            return JSONResponse({"auth_required": False, "authenticated": True})
        try:
            raw = bytearray()
            async for piece in request.stream():
                raw += piece
                if len(raw) > LOGIN_MAX_BYTES:
                    raise ValueError("too large")
            body = json.loads(bytes(raw))
            key = body["api_key"]
            if not isinstance(key, str):
                raise TypeError
        except (ValueError, KeyError, TypeError, ClientDisconnect):
            return JSONResponse(error_body('the body must be JSON {"api_key": "..."}', "invalid_request_error",
                                           param="api_key"), status_code=400)
        if not keys.accepts(key.strip()):
            await trio.sleep(0.5)  # a guess costs half a second
            return JSONResponse(error_body("Incorrect API key provided.", "invalid_request_error",
                                           code="invalid_api_key"), status_code=401)
        resp = JSONResponse({"auth_required": True, "authenticated": True})
        resp.set_cookie(COOKIE_NAME, sessions.issue(), max_age=int(sessions.ttl_s), httponly=True,
                        samesite="strict", secure=request.url.scheme == "https", path="/")
        return resp

    async def logout(request: Request) -> Response:
        token = session_cookie(request.headers.get("cookie", ""))
        if token and sessions is not None:
            sessions.revoke(token)
        resp = JSONResponse({"auth_required": auth_required, "authenticated": not auth_required})
        resp.delete_cookie(COOKIE_NAME, path="/")
        return resp

    async def events(request: Request) -> Response:
        if hub.streams >= MAX_STREAMS:
            return JSONResponse(
                error_body(f"{hub.streams} dashboard streams are open on this node (limit {MAX_STREAMS})",
                           "server_error", code="overloaded"),
                status_code=503, headers={"Retry-After": "5"})
        return StreamingResponse(hub.stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    return [
        Route("/dashboard", page, methods=["GET"]),
        Route("/dashboard/static/{name}", static, methods=["GET"]),
        Route("/dashboard/session", session, methods=["GET"]),
        Route("/dashboard/login", login, methods=["POST"]),
        Route("/dashboard/logout", logout, methods=["POST"]),
        Route("/dashboard/events", events, methods=["GET"]),
    ]
