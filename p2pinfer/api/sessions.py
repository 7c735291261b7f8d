"""Browser sessions for the dashboard when the API has keys.

A browser's ``EventSource`` cannot send an ``Authorization`` header, so the
dashboard's login form posts the API key once to ``/dashboard/login`` and
gets back an HttpOnly, ``SameSite=Strict`` cookie holding a random session
token. :class:`~p2pinfer.api.auth.AuthMiddleware` accepts that cookie in place
of the Bearer key; a state-changing request (POST) with the cookie must also
carry the :data:`CSRF_HEADER` header, which a page of another origin cannot
set without the node's consent (no CORS here). Sessions live in this node's
memory only: a restart logs everyone out.
"""

from __future__ import annotations

import hashlib
import secrets
import time

__all__ = ["COOKIE_NAME", "CSRF_HEADER", "DashboardSessions"]

COOKIE_NAME = "p2pinfer_session"
CSRF_HEADER = "x-p2pinfer-dashboard"


class DashboardSessions:
    """Session tokens, kept as SHA-256 digests with an expiry; the oldest dropped past ``capacity``."""

    def __init__(self, ttl_s: float = 12 * 3600.0, capacity: int = 256) -> None:
        self.ttl_s = ttl_s
        self.capacity = capacity
        self._expiry: dict[bytes, float] = {}

    def __len__(self) -> int:
        return len(self._expiry)

    def issue(self, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        self._purge(now)
        while len(self._expiry) >= self.capacity:
            self._expiry.pop(next(iter(self._expiry)))
        token = secrets.token_urlsafe(32)
        self._expiry[hashlib.sha256(token.encode()).digest()] = now + self.ttl_s
        return token

    def valid(self, token: str, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        # A dict lookup by digest: its timing could only tell a digest, never a token.
        expiry = self._expiry.get(hashlib.sha256(token.encode()).digest())
        return expiry is not None and expiry > now

    def revoke(self, token: str) -> None:
        self._expiry.pop(hashlib.sha256(token.encode()).digest(), None)

    def _purge(self, now: float) -> None:
        for digest in [d for d, e in self._expiry.items() if e <= now]:
            del self._expiry[digest]
