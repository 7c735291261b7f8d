"""A TCP relay that adds a fixed one-way delay in each direction.

The fallback for ``p2pinfer bench swarm --delay-ms`` where the kernel has
no ``netem`` qdisc (or we are not root): node *i* listens on a private
port and announces the relay's port instead, so every libp2p connection
to it crosses the relay, and every byte spends ``delay_ms`` in each
direction. Bytes keep their order; throughput is not shaped.
"""

from __future__ import annotations

from collections import deque
import socket
import threading
from typing import Any

import trio

__all__ = ["DelayRelays", "free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


async def _pump(src: trio.SocketStream, dst: trio.SocketStream, delay_s: float) -> None:
    """Read from ``src`` and write each piece to ``dst`` ``delay_s`` later, in order."""
    queue: deque[tuple[float, bytes]] = deque()
    wake = trio.Event()
    done = False

    async def reader() -> None:
        nonlocal done
        try:
            while True:
                data = await src.receive_some(65536)
                if not data:
                    break
                queue.append((trio.current_time() + delay_s, data))
                wake.set()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        done = True
        wake.set()

    async def writer() -> None:
        nonlocal wake
        try:
            while True:
                while not queue:
                    if done:
                        await dst.send_eof()
                        return
                    wake = trio.Event()
                    await wake.wait()
                due, data = queue[0]
                await trio.sleep_until(due)
                queue.popleft()
                await dst.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        nursery.start_soon(writer)


async def _relay(listen_port: int, target_port: int, delay_s: float, host: str,
                 task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    async def handle(client: trio.SocketStream) -> None:
        try:
            upstream = await trio.open_tcp_stream(host, target_port)
        except OSError:
            await client.aclose()
            return
        async with client, upstream:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_pump, client, upstream, delay_s)
                nursery.start_soon(_pump, upstream, client, delay_s)

    listeners = await trio.open_tcp_listeners(listen_port, host=host)
    task_status.started()
    await trio.serve_listeners(handle, listeners)


class DelayRelays:
    """One relay per node, run by trio in a background thread."""

    def __init__(self, pairs: list[tuple[int, int]], delay_ms: float, host: str = "127.0.0.1") -> None:
        self.pairs = pairs
        self.delay_ms = delay_ms
        self.host = host
        self._thread: threading.Thread | None = None
        self._token: Any = None
        self._cancel: trio.CancelScope | None = None
        self._ready = threading.Event()

    def _main(self) -> None:
        async def run() -> None:
            self._token = trio.lowlevel.current_trio_token()
            with trio.CancelScope() as scope:
                self._cancel = scope
                async with trio.open_nursery() as nursery:
                    for listen, target in self.pairs:
                        await nursery.start(_relay, listen, target, self.delay_ms / 1000, self.host)
                    self._ready.set()
        trio.run(run)

    def __enter__(self) -> DelayRelays:
        self._thread = threading.Thread(target=self._main, name="delay-relays", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("delay relays did not start")
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._token is not None and self._cancel is not None:
            trio.from_thread.run_sync(self._cancel.cancel, trio_token=self._token)
        if self._thread is not None:
            self._thread.join(10)
