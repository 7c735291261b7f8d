"""Serve a node's HTTP API with hypercorn on trio, inside a nursery."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from hypercorn.config import Config
from hypercorn.trio import serve
import trio

from .app import ApiLimits, create_app
from .auth import ApiKeys

if TYPE_CHECKING:
    from ..node import Node

__all__ = ["serve_http"]

log = logging.getLogger(__name__)


async def serve_http(
    node: Node,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    limits: ApiLimits | None = None,
    keys: ApiKeys | None = None,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the API until cancelled; ``task_status`` gets the bound (host, port).

    ``port=0`` picks a free port, which is what tests and ``p2pinfer swarm`` use.
    """
    async with trio.open_nursery() as nursery:

        def spawn(fn: Any, *args: Any) -> None:
            nursery.start_soon(fn, *args)

        app = create_app(node, spawn, limits=limits, keys=keys)
        config = Config()
        config.bind = [f"{host}:{port}"]
        config.accesslog = None
        config.keep_alive_timeout = 75
        config.graceful_timeout = 1.0
        config.h11_max_incomplete_size = 64 * 1024
        binds = await nursery.start(_serve, app, config)
        # hypercorn reports "http://host:port" for each bind; port 0 is resolved.
        bound = binds[0].rsplit(":", 1)
        api = (host, int(bound[1]))
        log.info("HTTP API on http://%s:%d", *api)
        task_status.started(api)


async def _serve(app: Any, config: Config, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
    await serve(app, config, mode="asgi", task_status=task_status)
