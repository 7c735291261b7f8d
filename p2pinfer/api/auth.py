"""API keys for a node's HTTP API, the way OpenAI clients send them.

A client sends ``Authorization: Bearer <key>`` (what ``OpenAI(api_key=...)``
does). With keys configured, every route needs one (``/status``,
``/metrics`` and the dashboard included) except those listed as open; a
missing or wrong key is a 401 in the OpenAI error format. Without keys the
API is open, which is only allowed on a loopback address unless the
operator says so explicitly (:func:`check_exposure`): anyone who can reach
the port would otherwise use the node's GPU and read its ``/status``.

The dashboard's page and its login route are always open (they hold no
data); the rest of it, and every other route, also accepts the session
cookie that ``/dashboard/login`` hands out for a valid key (:mod:`.sessions`).

A forwarded request is authorised at its entry node; peers authenticate
each other through libp2p (Noise, peer ids), not with these keys.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
import hashlib
import hmac
import ipaddress
import json
from pathlib import Path
from typing import Any

from .sessions import COOKIE_NAME, CSRF_HEADER, DashboardSessions

__all__ = ["ALWAYS_OPEN", "ApiKeys", "AuthMiddleware", "ExposureError", "check_exposure", "load_key_file"]

ALWAYS_OPEN = ("/dashboard", "/dashboard/static/", "/dashboard/login", "/dashboard/logout", "/dashboard/session")
"""Paths open even with keys: the dashboard's page, its files and its login (no data in them)."""


class ExposureError(ValueError):
    """The API would listen beyond this machine with no key."""


def load_key_file(path: str | Path) -> list[str]:
    """Keys from a file, one per line; blank lines and ``#`` comments are ignored."""
    p = Path(path).expanduser()
    try:
        text = p.read_text()
    except OSError as exc:
        raise ValueError(f"api_key_file {p}: {exc.strerror or exc}") from None
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]


class ApiKeys:
    """The accepted keys, kept as SHA-256 digests and compared in constant time."""

    def __init__(self, keys: Iterable[str] = (), *, open_routes: Sequence[str] = ()) -> None:
        digests = []
        for key in keys:
            if not isinstance(key, str) or len(key) < 8 or any(c.isspace() for c in key):
                raise ValueError("an API key must be at least 8 characters without spaces")
            digests.append(hashlib.sha256(key.encode()).digest())
        self._digests = tuple(dict.fromkeys(digests))
        for route in open_routes:
            if not route.startswith("/"):
                raise ValueError(f"open route {route!r} must start with '/'")
        self.open_routes = tuple(open_routes)

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def __len__(self) -> int:
        return len(self._digests)

    def accepts(self, key: str) -> bool:
        given = hashlib.sha256(key.encode()).digest()
        ok = False
        for digest in self._digests:  # no early exit: the time does not say which key matched
            ok |= hmac.compare_digest(given, digest)
        return ok

    def is_open(self, path: str) -> bool:
        return any(path == r or path.startswith(r.rstrip("/") + "/") for r in self.open_routes)


def _is_loopback(host: str) -> bool:
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(http_host: str, keys: ApiKeys, allow_unauthenticated: bool) -> None:
    """Refuse an API without keys on anything but loopback, unless explicitly allowed."""
    if keys.enabled or allow_unauthenticated or _is_loopback(http_host):
        return
    raise ExposureError(
        f"http_host {http_host!r} is reachable from other machines, and the API has no key: anyone who can "
        "reach the port could use this node and read its status. Give a key (--api-key, P2PINFER_API_KEY or "
        "api_key_file) or, if the network is trusted, --allow-unauthenticated."
    )


def _unauthorised(message: str, code: str) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}})
    headers = [(b"content-type", b"application/json"), (b"www-authenticate", b'Bearer realm="p2pinfer"')]
    return body.encode(), headers


class AuthMiddleware:
    """ASGI middleware (not starlette's BaseHTTPMiddleware, which buffers streams)."""

    def __init__(self, app: Any, keys: ApiKeys, sessions: DashboardSessions | None = None) -> None:
        self.app = app
        self.keys = keys
        self.sessions = sessions

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if (scope["type"] != "http" or not self.keys.enabled or self.keys.is_open(path)
                or any(path == p or (p.endswith("/") and path.startswith(p)) for p in ALWAYS_OPEN)):
            await self.app(scope, receive, send)
            return
        header = b""
        csrf = False
        cookie = ""
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                header = value
            elif name == b"cookie":
                cookie = session_cookie(value.decode("latin-1")) or cookie
            elif name == CSRF_HEADER.encode():
                csrf = True
        if not header and cookie and self.sessions is not None and self.sessions.valid(cookie):
            if scope.get("method", "GET") in ("GET", "HEAD") or csrf:
                await self.app(scope, receive, send)
                return
            body, headers = _unauthorised(
                f"A request authorised by the dashboard's session cookie must carry the {CSRF_HEADER} header.",
                "missing_csrf_header",
            )
            await send({"type": "http.response.start", "status": 403, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        scheme, _, token = header.decode("latin-1").partition(" ")
        if not header and cookie:
            body, headers = _unauthorised("The dashboard session has expired or is unknown: log in again.",
                                          "invalid_session")
        elif not header:
            body, headers = _unauthorised(
                "You didn't provide an API key. Send it in an Authorization header using Bearer auth "
                "(Authorization: Bearer YOUR_KEY; OpenAI clients do that with api_key=...).",
                "missing_api_key",
            )
        elif scheme.lower() != "bearer" or not token.strip():
            body, headers = _unauthorised("The Authorization header must be 'Bearer YOUR_KEY'.", "invalid_api_key")
        elif not self.keys.accepts(token.strip()):
            body, headers = _unauthorised("Incorrect API key provided.", "invalid_api_key")
        else:
            await self.app(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def session_cookie(header: str) -> str | None:
    """The dashboard session token in a ``Cookie`` header, if any."""
    for part in header.split(";"):
        name, _, value = part.strip().partition("=")
        if name == COOKIE_NAME and value:
            return value
    return None
