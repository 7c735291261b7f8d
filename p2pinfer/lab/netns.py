"""Nodes in their own Linux network namespaces, joined by veth pairs and a
bridge, with ``tc netem`` delay between nodes (``p2pinfer bench swarm --delay-ms``).

Topology: a bridge ``p2pibr0`` in the root namespace at 10.77.0.254 (the
benchmark client lives there); node *i* in namespace ``p2pi-n<i>`` at
10.77.0.<i+1>. Each node's interface delays packets to other nodes (10.77.0.0/25)
by the requested one-way delay and leaves packets to the client alone, so
the delay is paid on node-to-node links only, exactly once per direction.
Needs root (CAP_NET_ADMIN); :class:`NetnsUnavailable` otherwise.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Any

__all__ = ["NetemSetup", "NetnsUnavailable"]

BRIDGE = "p2pibr0"
CLIENT_IP = "10.77.0.254"


class NetnsUnavailable(RuntimeError):
    pass


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


class NetemSetup:
    def __init__(self, nodes: int, delay_ms: float, jitter_ms: float = 0.0) -> None:
        if not 1 <= nodes <= 100:
            raise ValueError("1..100 nodes")
        self.nodes = nodes
        self.delay_ms = delay_ms
        self.jitter_ms = jitter_ms
        self.namespaces = [f"p2pi-n{i}" for i in range(nodes)]
        self.hosts = [f"10.77.0.{i + 1}" for i in range(nodes)]
        self.wrap = [["ip", "netns", "exec", ns] for ns in self.namespaces]
        self.measured_rtt_ms: float | None = None

    def _run(self, *cmd: str) -> None:
        res = subprocess.run(list(cmd), capture_output=True, text=True)
        if res.returncode != 0:
            raise NetnsUnavailable(f"`{' '.join(cmd)}` failed: {res.stderr.strip() or res.stdout.strip()}")

    def __enter__(self) -> NetemSetup:
        if shutil.which("ip") is None or shutil.which("tc") is None:
            raise NetnsUnavailable("the ip and tc commands (iproute2) are not installed")
        if self.delay_ms > 0:
            self.probe_netem()
        self.teardown()
        try:
            self._run("ip", "link", "add", BRIDGE, "type", "bridge")
            self._run("ip", "addr", "add", f"{CLIENT_IP}/24", "dev", BRIDGE)
            self._run("ip", "link", "set", BRIDGE, "up")
            for i, (ns, host) in enumerate(zip(self.namespaces, self.hosts)):
                outer, inner = f"p2pi{i}o", f"p2pi{i}i"
                self._run("ip", "netns", "add", ns)
                self._run("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
                self._run("ip", "link", "set", inner, "netns", ns)
                self._run("ip", "link", "set", outer, "master", BRIDGE)
                self._run("ip", "link", "set", outer, "up")
                ex = ["ip", "netns", "exec", ns]
                self._run(*ex, "ip", "link", "set", "lo", "up")
                self._run(*ex, "ip", "addr", "add", f"{host}/24", "dev", inner)
                self._run(*ex, "ip", "link", "set", inner, "up")
                if self.delay_ms > 0:
                    # Band 1 (no delay) by default; packets to nodes go to band 3, delayed.
                    self._run(*ex, "tc", "qdisc", "add", "dev", inner, "root", "handle", "1:", "prio",
                              "bands", "3", "priomap", *(["0"] * 16))
                    netem = ["netem", "delay", f"{self.delay_ms}ms"]
                    if self.jitter_ms:
                        netem.append(f"{self.jitter_ms}ms")
                    self._run(*ex, "tc", "qdisc", "add", "dev", inner, "parent", "1:3", "handle", "30:", *netem,
                              "limit", "100000")
                    self._run(*ex, "tc", "filter", "add", "dev", inner, "protocol", "ip", "parent", "1:0", "prio", "1",
                              "u32", "match", "ip", "dst", "10.77.0.0/25", "flowid", "1:3")
        except NetnsUnavailable:
            self.teardown()
            raise
        self.measured_rtt_ms = self.measure_rtt()
        return self

    @staticmethod
    def probe_netem() -> None:
        """Fail early, with the reason, where namespaces or netem are missing."""
        probe = "p2pi-probe"
        _ip("netns", "del", probe, check=False)
        res = _ip("netns", "add", probe, check=False)
        if res.returncode != 0:
            raise NetnsUnavailable(f"cannot create a network namespace (root needed): {res.stderr.strip()}")
        try:
            res = subprocess.run(["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "lo", "root",
                                  "netem", "delay", "1ms"], capture_output=True, text=True)
            if res.returncode != 0:
                raise NetnsUnavailable(f"this kernel has no netem qdisc (sch_netem): {res.stderr.strip()}")
        finally:
            _ip("netns", "del", probe, check=False)

    def measure_rtt(self) -> float | None:
        """Median ping RTT between node 0 and node 1 (ms), as really applied."""
        if self.nodes < 2:
            return None
        res = subprocess.run(
            ["ip", "netns", "exec", self.namespaces[0], "ping", "-c", "5", "-i", "0.2", "-q", self.hosts[1]],
            capture_output=True, text=True,
        )
        match = re.search(r"= [\d.]+/([\d.]+)/", res.stdout)
        return float(match.group(1)) if match else None

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "netns+veth+bridge, tc netem on node-to-node traffic",
            "requested_one_way_delay_ms": self.delay_ms,
            "measured_rtt_ms": self.measured_rtt_ms,
            "measured_one_way_delay_ms": None if self.measured_rtt_ms is None else round(self.measured_rtt_ms / 2, 3),
        }

    def teardown(self) -> None:
        for ns in self.namespaces:
            _ip("netns", "del", ns, check=False)
        for i in range(self.nodes):
            _ip("link", "del", f"p2pi{i}o", check=False)
        _ip("link", "del", BRIDGE, check=False)

    def __exit__(self, *exc: Any) -> None:
        self.teardown()
