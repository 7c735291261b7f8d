"""Start and drive nodes in subprocesses (tests and ``bench overlay``).

:class:`NodeProcess` runs ``python -m p2pinfer.lab.scripted_node`` and talks
to it over JSON lines; it is synchronous (a reader thread sorts replies by
id) so that tests need not share the node's event loop.
"""

from __future__ import annotations

from collections.abc import Callable
import itertools
import json
import os
from pathlib import Path
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import Any, TypeVar

from ..core.router import GossipConfig, RouterConfig
from ..net.config import NodeConfig

__all__ = ["NodeProcess", "RemoteCallError", "fast_config", "wait_for", "wait_until"]

T = TypeVar("T")


class RemoteCallError(RuntimeError):
    def __init__(self, message: str, kind: str = "") -> None:
        super().__init__(message)
        self.kind = kind


NO_CHECK_CACHE: dict[str, bool] = {"check_cache": False}
"""Engine options of a benchmark node that keeps no prompt it checked (``check_cache`` off): an
entry that checks a new peer's probation answers would otherwise keep the checked prompts and
serve their later requests itself, so the forwards a benchmark measures would not happen
(``lab nat``, ``bench liar``, ``bench directory``). Callers copy it."""


def fast_config(
    *,
    bootstrap: tuple[str, ...] = (),
    speed: float = 0.0,
    policy: str = "cost",
    gossip: GossipConfig | None = None,
    busy_queue_ms: float = 4000.0,
    **kwargs: Any,
) -> NodeConfig:
    """A loopback node with an ephemeral port and a short gossip schedule."""
    gossip = gossip or GossipConfig(
        delta_interval_s=0.1, full_interval_s=1.0, load_interval_s=0.25, keepalive_interval_s=0.5, peer_ttl_s=2.0
    )
    engine_options = {"speed": speed, **kwargs.pop("engine_options", {})}
    kwargs.setdefault("connect_timeout_s", 5.0)
    kwargs.setdefault("stall_timeout_s", 10.0)
    return NodeConfig(
        listen=("/ip4/127.0.0.1/tcp/0",),
        bootstrap=bootstrap,
        engine="simulated",
        engine_options=engine_options,
        router=RouterConfig(policy=policy, gossip=gossip, busy_queue_ms=busy_queue_ms),
        **kwargs,
    )


def wait_until(fn: Callable[[], T], timeout_s: float, interval_s: float = 0.05, what: str = "condition") -> T:
    """Poll ``fn`` until it returns something truthy; raises TimeoutError with ``what``."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while True:
        last = fn()
        if last:
            return last
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout_s} s (last: {last!r})")
        time.sleep(interval_s)


async def wait_for(predicate: Callable[[], object], timeout_s: float = 10.0) -> None:
    """Inside trio, for in-process nodes: until ``predicate()`` is truthy (raises ``trio.TooSlowError``)."""
    import trio

    with trio.fail_after(timeout_s):
        while not predicate():
            await trio.sleep(0.02)


class NodeProcess:
    def __init__(
        self,
        config: NodeConfig,
        name: str = "node",
        log_dir: Path | None = None,
        start_timeout_s: float = 60.0,
        *,
        lying: bool = False,
        wrong_tokens: str | None = None,
        wrap: list[str] | tuple[str, ...] = (),
    ) -> None:
        """``lying``: the node runs :class:`~p2pinfer.lab.lying.LyingRouter`;
        ``wrong_tokens`` (``random``, ``other-model``): it answers with
        :class:`~p2pinfer.lab.wrong_tokens.WrongTokenEngine`; ``wrap``
        prefixes the command (``ip netns exec <ns>``: the NAT testbed)."""
        self.name = name
        self.lying = lying
        self.config = config
        self._ids = itertools.count(1)
        self._pending: dict[int, queue.Queue[dict[str, Any]]] = {}
        self._events: dict[int, queue.Queue[dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self._ready: queue.Queue[dict[str, Any]] = queue.Queue()
        self.stderr_path = (log_dir or Path(os.environ.get("TMPDIR", "/tmp"))) / f"p2pinfer-{name}-{os.getpid()}-{id(self)}.log"
        self._stderr = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(
            [*wrap, sys.executable, "-m", "p2pinfer.lab.scripted_node", *(["--lying"] if lying else []),
             *(["--wrong-tokens", wrong_tokens] if wrong_tokens else [])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(config.to_dict()) + "\n").encode())
        self.proc.stdin.flush()
        self.stopped = threading.Event()
        self._reader = threading.Thread(target=self._read, name=f"{name}-reader", daemon=True)
        self._reader.start()
        try:
            ready = self._ready.get(timeout=start_timeout_s)
        except queue.Empty:
            self.kill()
            raise RuntimeError(f"{name} did not start within {start_timeout_s} s; log: {self.log_tail()}") from None
        if ready.get("event") != "ready":
            raise RuntimeError(f"{name} failed to start: {self.log_tail()}")
        self.peer_id: str = ready["peer_id"]
        self.addrs: list[str] = ready["addrs"]
        self.pid: int = ready["pid"]

    @property
    def addr(self) -> str:
        return self.addrs[0]

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            try:
                msg = json.loads(raw)
            except ValueError:
                continue
            if msg.get("event") == "ready":
                self._ready.put(msg)
            elif msg.get("event") == "stopped":
                self.stopped.set()
            elif msg.get("event") == "chunk":
                with self._lock:
                    q = self._events.get(msg["id"])
                if q is not None:
                    q.put(msg)
            else:
                with self._lock:
                    q = self._pending.get(msg.get("id"))
                if q is not None:
                    q.put(msg)
        self._ready.put({"event": "exited"})
        with self._lock:
            for q in self._pending.values():
                q.put({"ok": False, "error": "node process exited", "type": "Exited"})

    def start_call(self, cmd: str, **args: Any) -> Callable[[float], Any]:
        """Send a command; returns ``wait(timeout_s)`` giving its result."""
        msg_id = next(self._ids)
        q: queue.Queue[dict[str, Any]] = queue.Queue()
        with self._lock:
            self._pending[msg_id] = q
            self._events[msg_id] = queue.Queue()
        line = json.dumps({"id": msg_id, "cmd": cmd, **args}) + "\n"
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(line.encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            q.put({"ok": False, "error": "node process exited", "type": "Exited"})

        def wait(timeout_s: float = 30.0) -> Any:
            try:
                reply = q.get(timeout=timeout_s)
            except queue.Empty:
                raise TimeoutError(f"{self.name}: {cmd} got no answer within {timeout_s} s") from None
            finally:
                with self._lock:
                    self._pending.pop(msg_id, None)
            if not reply.get("ok"):
                raise RemoteCallError(f"{self.name}: {cmd} failed: {reply.get('error')}", reply.get("type", ""))
            return reply.get("result")

        wait.events = self._events[msg_id]  # type: ignore[attr-defined]
        return wait

    def call(self, cmd: str, timeout_s: float = 30.0, **args: Any) -> Any:
        return self.start_call(cmd, **args)(timeout_s)

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.stderr_path.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL: the node gets no chance to say goodbye."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def close(self, timeout_s: float = 15.0) -> int:
        """Ask for a clean shutdown; returns the exit code (killed if stuck)."""
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        self._stderr.close()
        return self.proc.returncode

    def __enter__(self) -> NodeProcess:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
