"""The OpenAI-compatible HTTP API, metrics and status of a node."""

from .app import ApiLimits, create_app
from .auth import ApiKeys
from .server import serve_http

__all__ = ["ApiKeys", "ApiLimits", "create_app", "serve_http"]
