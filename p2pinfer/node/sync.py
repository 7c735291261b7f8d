"""A blocking wrapper for scripts and notebooks that do not use trio."""

from __future__ import annotations

import threading
from typing import Any

import trio

from ..engines.base import Engine, GenerationParams
from ..net.config import NodeConfig
from .results import GenerateResult, NodeError, Prompt
from .wiring import Node

__all__ = ["SyncNode"]



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
