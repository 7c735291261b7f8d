"""A swarm of ``p2pinfer node`` processes on this machine.

Used by ``p2pinfer swarm``, ``p2pinfer demo`` and ``p2pinfer bench swarm``:
each node is a real OS process with its own libp2p host, engine and HTTP
API; the first node is the others' bootstrap peer. Nodes report their
addresses through a ready file, so every port can be chosen by the kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
import json
import os
from pathlib import Path
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

import httpx

__all__ = ["LocalNode", "LocalSwarm", "SwarmError"]


class SwarmError(RuntimeError):
    """A node did not start; the message carries the end of its log."""


@dataclass
class LocalNode:
    index: int
    process: subprocess.Popen[bytes]
    log_path: Path
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def http(self) -> str:
        return str(self.info["http"])

    @property
    def peer_id(self) -> str:
        return str(self.info["peer_id"])

    @property
    def p2p_addr(self) -> str:
        return f"{self.info['addrs'][0]}" if "/p2p/" in self.info["addrs"][0] else f"{self.info['addrs'][0]}/p2p/{self.peer_id}"

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.process.poll() is None

    def wait_reply_saves(self, timeout_s: float = 120.0, poll_s: float = 0.25) -> dict[str, Any] | None:
        """Until the node saves no reply (it saves each answer's after its stream ended), or
        ``timeout_s``: its ``/status`` ``engine.reply_saves`` then, None when it reports none."""
        deadline = time.monotonic() + timeout_s
        while True:
            saves = httpx.get(self.http + "/status", timeout=30).json().get("engine", {}).get("reply_saves")
            if saves is None or saves["in_progress"] == 0 or time.monotonic() > deadline:
                return saves
            time.sleep(poll_s)

    def death_report(self, lines: int = 12) -> str:
        """Why the process ended, its last log lines and what to run next.

        A native crash leaves faulthandler's "Fatal Python error" and the
        crashing thread's stack in the log: those lines, and the log lines
        just before them, are what a person needs to see.
        """
        from ..engines.engine_check import describe_exit

        rc = self.process.poll()
        sig, phrase = describe_exit(rc if rc is not None else 0)
        log = [ln for ln in self.log_tail(20000).rstrip().splitlines() if not ln.startswith("Extension modules:")]
        crash = next((i for i, ln in enumerate(log) if ln.startswith("Fatal Python error")), None)
        shown = log[-lines:] if crash is None else log[max(0, crash - 5) : crash + lines]
        tail = "\n".join("    " + ln for ln in shown)
        text = f"node {self.index} {phrase}"
        if sig is not None:
            text += " (a crash inside native code such as llama.cpp kills the whole process)"
        text += f"; from its log ({self.log_path}):\n{tail or '    (empty)'}"
        if sig is not None or rc == 3:
            text += "\nRun `p2pinfer doctor` to see which engine configuration works on this machine."
        return text


class LocalSwarm:
    """Start ``n`` nodes; ``with LocalSwarm(...) as swarm:`` stops them on exit."""

    def __init__(
        self,
        n: int,
        *,
        engine: str = "llama-cpp",
        policy: str = "cost",
        node_args: Sequence[str] = (),
        per_node_args: Sequence[Sequence[str]] | None = None,
        workdir: str | os.PathLike[str] | None = None,
        start_timeout_s: float = 120.0,
        host: str = "127.0.0.1",
        env: dict[str, str] | None = None,
        wrap: Sequence[Sequence[str]] | None = None,
        link_delay_ms: float | None = None,
    ) -> None:
        """``wrap[i]`` prefixes node i's command (e.g. ``ip netns exec ns0``).

        ``link_delay_ms`` puts a :class:`~p2pinfer.lab.delay_proxy.DelayRelays`
        relay in front of every node's libp2p port: node-to-node traffic
        then pays that one-way delay in each direction (HTTP does not).
        """
        if n < 1:
            raise ValueError("a swarm needs at least one node")
        self.n = n
        self.engine = engine
        self.policy = policy
        self.node_args = list(node_args)
        self.per_node_args = [list(a) for a in per_node_args] if per_node_args else [[] for _ in range(n)]
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="p2pinfer-swarm-")
        self.workdir = Path(workdir or self._tmp.name)  # type: ignore[union-attr]
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.start_timeout_s = start_timeout_s
        self.host = host
        self.env = env
        self.wrap = [list(w) for w in wrap] if wrap else [[] for _ in range(n)]
        self.nodes: list[LocalNode] = []
        self.link_delay_ms = link_delay_ms
        self._relays: Any = None
        self._ports: list[tuple[int, int]] = []

    def _spawn(self, i: int, bootstrap: str | None) -> LocalNode:
        ready = self.workdir / f"node{i}.ready.json"
        ready.unlink(missing_ok=True)
        log_path = self.workdir / f"node{i}.log"
        listen_host = self.per_node_host(i)
        if self._ports:
            private, public = self._ports[i]
            addr_args = ["--listen", f"/ip4/{listen_host}/tcp/{private}", "--announce", f"/ip4/{listen_host}/tcp/{public}"]
        else:
            addr_args = ["--listen", f"/ip4/{listen_host}/tcp/0"]
        cmd = [
            *self.wrap[i], sys.executable, "-m", "p2pinfer", "node",
            "--engine", self.engine, "--policy", self.policy, *addr_args,
            "--http-host", listen_host, "--http-port", "0",
            "--key-file", str(self.workdir / f"node{i}.key"),
            "--ready-file", str(ready), "--quiet", "--log-level", "WARNING",
            *self.node_args, *self.per_node_args[i],
        ]
        if bootstrap:
            cmd += ["--bootstrap", bootstrap]
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        log = open(log_path, "wb")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log.close()
        return LocalNode(i, proc, log_path, {"ready_file": str(ready)})

    def per_node_host(self, i: int) -> str:
        return self.host if isinstance(self.host, str) else self.host[i]

    def describe_network(self) -> dict[str, Any]:
        if self.link_delay_ms is not None:
            return {"kind": "loopback through delay relays (userspace)", "requested_one_way_delay_ms": self.link_delay_ms}
        return {"kind": "loopback"}

    def _wait_ready(self, node: LocalNode) -> None:
        ready = Path(node.info["ready_file"])
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if ready.exists():
                node.info.update(json.loads(ready.read_text()))
                return
            if not node.alive():
                raise SwarmError(node.death_report())
            time.sleep(0.05)
        raise SwarmError(f"node {node.index} not ready after {self.start_timeout_s:.0f} s:\n{node.log_tail()}")

    def start(self) -> LocalSwarm:
        if self.link_delay_ms is not None:
            from .delay_proxy import DelayRelays, free_port

            host = self.per_node_host(0)
            self._ports = [(free_port(host), free_port(host)) for _ in range(self.n)]
            self._relays = DelayRelays([(pub, priv) for priv, pub in self._ports], self.link_delay_ms, host)
            self._relays.__enter__()
        first = self._spawn(0, None)
        self.nodes = [first]
        self._wait_ready(first)
        rest = [self._spawn(i, first.p2p_addr) for i in range(1, self.n)]
        self.nodes += rest
        for node in rest:
            self._wait_ready(node)
        return self

    def restart(self, i: int) -> LocalNode:
        """Start node ``i`` again after it died or was killed: same key file,
        so the same peer id, with an empty cache; returns once it is ready."""
        if self.nodes[i].alive():
            raise SwarmError(f"node {i} is still running")
        bootstrap = next((n.p2p_addr for n in self.nodes if n.index != i and n.alive()), None)
        node = self._spawn(i, bootstrap)
        self.nodes[i] = node
        self._wait_ready(node)
        return node

    def check_alive(self) -> None:
        """Raise :class:`SwarmError` with a death report if any node has exited."""
        dead = [n for n in self.nodes if not n.alive()]
        if dead:
            raise SwarmError("\n".join(n.death_report() for n in dead))

    def wait_connected(self, timeout_s: float = 60.0, api_key: str | None = None) -> None:
        """Until every node sees every other node as eligible (same model, digest heard).

        ``api_key``: the nodes' key, when they were started with one."""
        deadline = time.monotonic() + timeout_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        with httpx.Client(timeout=5.0, headers=headers) as client:
            while True:
                counts = []
                for node in self.nodes:
                    try:
                        status = client.get(node.http + "/status").json()
                        counts.append(sum(1 for p in status["peers"] if p.get("eligible")))
                    except httpx.HTTPError:
                        counts.append(-1)
                if all(c >= self.n - 1 for c in counts):
                    return
                self.check_alive()
                if time.monotonic() > deadline:
                    raise SwarmError(f"swarm did not connect within {timeout_s:.0f} s (eligible peers per node: {counts})")
                time.sleep(0.2)

    def stop(self, timeout_s: float = 15.0) -> None:
        for node in self.nodes:
            if node.alive():
                try:
                    os.killpg(node.process.pid, signal.SIGINT)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + timeout_s
        for node in self.nodes:
            try:
                node.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(node.process.pid, signal.SIGKILL)
                node.process.wait()
        self.nodes = []
        if self._relays is not None:
            self._relays.__exit__(None, None, None)
            self._relays = None

    def __enter__(self) -> LocalSwarm:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: Any) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
