"""A NATed testbed in Linux network namespaces (``p2pinfer lab nat``).

Topology, all of it inside namespaces this module creates (nothing is
added to the root namespace, so no packet can leave for a real network)::

    ns "wan": bridge br0 (the "internet", 198.51.100.0/24, TEST-NET-2)
      ├── public host  pub<i>   198.51.100.(10+i)
      └── NAT router   nat<j>   wan0 198.51.100.(100+j)  ── lan bridge 192.168.(10+j).1/24
                                   └── private host nat<j>h<k>  192.168.(10+j).(2+k), default route via .1

Each NAT router masquerades its LAN behind its WAN address
(``iptables -t nat ... MASQUERADE``) and, as home routers do, drops
unsolicited packets from the WAN (only replies to connections opened from
inside get in). Two kinds:

* ``cone``: plain MASQUERADE. Linux keeps a connection's source port when
  it is free, so a socket bound to port *p* appears on the WAN as port *p*:
  the port-preserving NAT that TCP hole punching (DCUtR) assumes.
* ``symmetric``: MASQUERADE ``--random-fully``: every connection gets a
  random WAN port, so no peer can predict the mapping and hole punching
  must fail; only the relay works.

Names are unique per run (``p2nat-<pid>-<random>-...``) so parallel runs do
not collide; :meth:`NatTestbed.teardown` deletes every namespace of the
run (which deletes their interfaces, bridges and iptables rules with
them). It runs on exit of the ``with`` block, from an ``atexit`` hook and
on SIGINT/SIGTERM; and a new testbed first removes what runs whose
process died left behind. Needs root (CAP_NET_ADMIN), ``ip`` (iproute2)
and ``iptables``; :class:`NatTestbedUnavailable` says what is missing.
"""

from __future__ import annotations

import atexit
from dataclasses import dataclass, field
import os
import re
import secrets
import shutil
import signal
import subprocess
import threading
from types import FrameType
from typing import Any, Literal

__all__ = ["NAT_KINDS", "NatHost", "NatTestbed", "NatTestbedUnavailable", "cleanup_stale"]

NatKind = Literal["cone", "symmetric"]
NAT_KINDS: tuple[NatKind, ...] = ("cone", "symmetric")
PREFIX = "p2nat-"
WAN_NET = "198.51.100"
_NAME_RE = re.compile(rf"^{PREFIX}(\d+)-([0-9a-f]+)-")


class NatTestbedUnavailable(RuntimeError):
    """Namespaces, iptables or root are missing here (the message says which)."""


@dataclass(frozen=True)
class NatHost:
    """One machine of the testbed: a public host or a host on a NATed LAN."""

    name: str
    """``pub0``, ``nat1h0``..."""
    namespace: str
    ip: str
    nat: str | None = None
    """The router in front of it (``nat0``), ``None`` for a public host."""
    nat_kind: NatKind | None = None
    wan_ip: str | None = None
    """The address its traffic appears from on the WAN."""

    @property
    def wrap(self) -> list[str]:
        """Command prefix that runs a program on this host."""
        return ["ip", "netns", "exec", self.namespace]

    @property
    def public(self) -> bool:
        return self.nat is None


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(list(cmd), capture_output=True, text=True)
    if check and res.returncode != 0:
        raise NatTestbedUnavailable(f"`{' '.join(cmd)}` failed: {res.stderr.strip() or res.stdout.strip()}")
    return res


def _namespaces() -> list[str]:
    res = _run("ip", "netns", "list", check=False)
    return [line.split()[0] for line in res.stdout.splitlines() if line.strip()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup_stale() -> list[str]:
    """Delete the namespaces of earlier runs whose process is gone; returns their names.

    Only names this module made (``p2nat-<pid>-...``) and only when that
    pid no longer exists, so a run in progress elsewhere is never touched.
    """
    removed = []
    for ns in _namespaces():
        match = _NAME_RE.match(ns)
        if match and not _pid_alive(int(match.group(1))):
            _kill_namespace_processes(ns)
            _run("ip", "netns", "del", ns, check=False)
            removed.append(ns)
    return removed


def _kill_namespace_processes(ns: str) -> None:
    """SIGKILL what still runs in ``ns`` (a network namespace lives on while processes hold it)."""
    res = _run("ip", "netns", "pids", ns, check=False)
    for token in res.stdout.split():
        try:
            os.kill(int(token), signal.SIGKILL)
        except (ValueError, ProcessLookupError, PermissionError):
            pass


_LIVE: set[NatTestbed] = set()
_LIVE_LOCK = threading.Lock()
_HANDLERS_INSTALLED = False


def _teardown_all() -> None:
    with _LIVE_LOCK:
        beds = list(_LIVE)
    for bed in beds:
        bed.teardown()


def _install_handlers() -> None:
    """atexit and SIGINT/SIGTERM: a run that is interrupted still removes its namespaces."""
    global _HANDLERS_INSTALLED
    if _HANDLERS_INSTALLED:
        return
    _HANDLERS_INSTALLED = True
    atexit.register(_teardown_all)
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGINT, signal.SIGTERM):
        previous = signal.getsignal(sig)

        def handler(signum: int, frame: FrameType | None, previous: Any = previous) -> None:
            _teardown_all()
            if callable(previous):
                previous(signum, frame)
            elif signum == signal.SIGINT:
                raise KeyboardInterrupt
            else:
                raise SystemExit(128 + signum)

        signal.signal(sig, handler)


@dataclass
class NatTestbed:
    """``with NatTestbed(public=2, nats=("cone", "symmetric"), hosts_per_nat=2) as bed: ...``"""

    public: int = 1
    nats: tuple[NatKind, ...] = ("cone", "symmetric")
    hosts_per_nat: int = 2
    run_id: str = field(default_factory=lambda: f"{os.getpid()}-{secrets.token_hex(3)}")
    hosts: dict[str, NatHost] = field(default_factory=dict, init=False)
    _namespaces: list[str] = field(default_factory=list, init=False)
    _up: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        if not 1 <= self.public <= 50:
            raise ValueError("public: 1..50 hosts")
        if not 0 <= len(self.nats) <= 50:
            raise ValueError("nats: at most 50 routers")
        for kind in self.nats:
            if kind not in NAT_KINDS:
                raise ValueError(f"unknown NAT kind {kind!r} (one of {', '.join(NAT_KINDS)})")
        counts = self.host_counts
        if len(counts) != len(self.nats) or not all(1 <= n <= 50 for n in counts):
            raise ValueError("hosts_per_nat: 1..50 hosts, one count or one per NAT")

    @property
    def host_counts(self) -> tuple[int, ...]:
        if isinstance(self.hosts_per_nat, int):
            return (self.hosts_per_nat,) * len(self.nats)
        return tuple(self.hosts_per_nat)

    def __hash__(self) -> int:
        return id(self)

    # -- names ------------------------------------------------------------------------
    def ns(self, role: str) -> str:
        return f"{PREFIX}{self.run_id}-{role}"

    @property
    def wan_ns(self) -> str:
        return self.ns("wan")

    def nat_router_ns(self, j: int) -> str:
        return self.ns(f"nat{j}")

    # -- building -----------------------------------------------------------------------
    @staticmethod
    def check_available() -> None:
        if os.geteuid() != 0:
            raise NatTestbedUnavailable("the NAT testbed needs root (network namespaces, iptables)")
        for tool, package in (("ip", "iproute2"), ("iptables", "iptables")):
            if shutil.which(tool) is None:
                raise NatTestbedUnavailable(f"the {tool} command is missing (Debian package {package})")

    def _add_ns(self, name: str) -> str:
        _run("ip", "netns", "add", name)
        self._namespaces.append(name)
        _run("ip", "-n", name, "link", "set", "lo", "up")
        return name

    def _veth(self, ns_a: str, name_a: str, ns_b: str, name_b: str) -> None:
        """A veth pair created inside ``ns_a``: interface names only need to be unique per namespace."""
        _run("ip", "-n", ns_a, "link", "add", name_a, "type", "veth", "peer", "name", name_b, "netns", ns_b)

    def __enter__(self) -> NatTestbed:
        self.check_available()
        cleanup_stale()
        _install_handlers()
        with _LIVE_LOCK:
            _LIVE.add(self)
        try:
            self._build()
        except BaseException:
            self.teardown()
            raise
        self._up = True
        return self

    def _build(self) -> None:
        wan = self._add_ns(self.wan_ns)
        _run("ip", "-n", wan, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", wan, "link", "set", "br0", "up")
        for i in range(self.public):
            name = f"pub{i}"
            ns = self._add_ns(self.ns(name))
            ip = f"{WAN_NET}.{10 + i}"
            self._veth(wan, f"v{name}", ns, "eth0")
            _run("ip", "-n", wan, "link", "set", f"v{name}", "master", "br0", "up")
            _run("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            self.hosts[name] = NatHost(name, ns, ip, wan_ip=ip)
        for j, (kind, count) in enumerate(zip(self.nats, self.host_counts)):
            self._build_nat(j, kind, count)

    def _build_nat(self, j: int, kind: NatKind, count: int) -> None:
        router = f"nat{j}"
        rns = self._add_ns(self.nat_router_ns(j))
        wan_ip = f"{WAN_NET}.{100 + j}"
        lan = f"192.168.{10 + j}"
        self._veth(self.wan_ns, f"v{router}", rns, "wan0")
        _run("ip", "-n", self.wan_ns, "link", "set", f"v{router}", "master", "br0", "up")
        _run("ip", "-n", rns, "addr", "add", f"{wan_ip}/24", "dev", "wan0")
        _run("ip", "-n", rns, "link", "set", "wan0", "up")
        _run("ip", "-n", rns, "link", "add", "lan", "type", "bridge")
        _run("ip", "-n", rns, "addr", "add", f"{lan}.1/24", "dev", "lan")
        _run("ip", "-n", rns, "link", "set", "lan", "up")
        ex = ["ip", "netns", "exec", rns]
        _run(*ex, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
        masquerade = ["iptables", "-t", "nat", "-A", "POSTROUTING", "-s", f"{lan}.0/24", "-o", "wan0", "-j", "MASQUERADE"]
        if kind == "symmetric":
            masquerade.append("--random-fully")
        _run(*ex, *masquerade)
        # A home router's firewall: from the WAN only replies get in.
        for chain in ("FORWARD", "INPUT"):
            _run(*ex, "iptables", "-A", chain, "-i", "wan0", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT")
            _run(*ex, "iptables", "-A", chain, "-i", "wan0", "-j", "DROP")
        for k in range(count):
            name = f"{router}h{k}"
            ns = self._add_ns(self.ns(name))
            ip = f"{lan}.{2 + k}"
            self._veth(rns, f"v{k}", ns, "eth0")
            _run("ip", "-n", rns, "link", "set", f"v{k}", "master", "lan", "up")
            _run("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "-n", ns, "route", "add", "default", "via", f"{lan}.1")
            self.hosts[name] = NatHost(name, ns, ip, nat=router, nat_kind=kind, wan_ip=wan_ip)

    # -- using ---------------------------------------------------------------------------
    def host(self, name: str) -> NatHost:
        return self.hosts[name]

    @property
    def public_hosts(self) -> list[NatHost]:
        return [h for h in self.hosts.values() if h.public]

    @property
    def private_hosts(self) -> list[NatHost]:
        return [h for h in self.hosts.values() if not h.public]

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "Linux network namespaces: a WAN bridge, iptables MASQUERADE routers in front of private LANs",
            "run_id": self.run_id,
            "wan": f"{WAN_NET}.0/24",
            "nats": {f"nat{j}": {"kind": k, "wan_ip": f"{WAN_NET}.{100 + j}", "lan": f"192.168.{10 + j}.0/24"}
                     for j, k in enumerate(self.nats)},
            "hosts": {h.name: {"ip": h.ip, "nat": h.nat, "nat_kind": h.nat_kind, "wan_ip": h.wan_ip}
                      for h in self.hosts.values()},
        }

    def teardown(self) -> None:
        """Delete every namespace of this run (idempotent; never raises)."""
        for ns in reversed(self._namespaces):
            _kill_namespace_processes(ns)
            _run("ip", "netns", "del", ns, check=False)
        self._namespaces.clear()
        self._up = False
        with _LIVE_LOCK:
            _LIVE.discard(self)

    def __exit__(self, *exc: Any) -> None:
        self.teardown()
