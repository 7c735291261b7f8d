from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import trio

from p2pinfer.api import ApiLimits, serve_http
from p2pinfer.node import Node, NodeConfig


@dataclass
class Api:
    node: Node
    base_url: str
    limits: ApiLimits


@pytest.fixture
async def api(nursery: trio.Nursery) -> AsyncIterator[Api]:
    """One node with the simulated engine (instant) and its HTTP API on a free port."""
    config = NodeConfig(listen=("/ip4/127.0.0.1/tcp/0",), engine="simulated", engine_options={"speed": 0})
    async with Node(config) as node:
        limits = ApiLimits()
        host, port = await nursery.start(lambda task_status: serve_http(node, "127.0.0.1", 0, limits=limits, task_status=task_status))
        yield Api(node, f"http://{host}:{port}", limits)
        nursery.cancel_scope.cancel()
