"""Is this node publicly reachable? Peers dial it back over a fresh connection.

Why our own protocol: py-libp2p 0.8.1 ships AutoNAT v1
(``libp2p.host.autonat``), but its server "dials back" with
``host.connect()``, which returns at once when a connection to the peer
already exists, and one always does (the request came on it). Every
dial-back therefore "succeeds" and a node behind NAT is told it is
PUBLIC. It also wants four agreeing servers before its status moves,
which a small swarm with one public node never has.

``/p2pinfer/reachability/1.0.0`` (messages in protos/p2pinfer.proto):
the client sends its direct addresses and a nonce; the server dials one
of them whose IP is the one it sees the client at (the AutoNAT rule
against amplification) with ``Swarm.dial_addr``, which always opens a
*new* connection, and on that connection opens ``/p2pinfer/dialback/1.0.0``
to hand over the nonce, then closes it. The client believes a dial-back
only when the nonce arrives on a direct, inbound connection that is not
the one its request used. Verdicts:

* ``public``: at least one server's dial-back proved itself;
* ``private``: servers could not dial back, or none of our addresses has
  the IP they see us at (we are behind a NAT that rewrites it);
* ``unknown``: nobody answered yet.

A server that answers "ok" without a proof is counted
(``reachability_untrusted``) and ignored. A dial-back from a server that
sees us at a LAN address (RFC 1918, carrier-grade NAT 100.64/10, loopback,
link-local, IPv6 ULA) only proves that our LAN can reach us: it is recorded
as ``lan`` and decides nothing, so two volunteers behind one home router
never call each other public, and a swarm on loopback stays ``unknown``
(nothing there needs a relay).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
import ipaddress
import logging
import random
import secrets
import time
from typing import Any

import multiaddr
import trio

from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from .connections import connections_of, ip_of, is_relayed, open_stream_on, remote_ip, swarm_conn_of
from .counters import NodeCounters
from .framing import FrameError, FrameReader, finish_stream, write_frame
from .wire import (
    DIALBACK_MAX_BYTES,
    DIALBACK_NONCE_BYTES,
    DialBackAnswer,
    WireError,
    decode_dialback_proof,
    decode_dialback_request,
    decode_dialback_response,
    encode_dialback_proof,
    encode_dialback_request,
    encode_dialback_response,
)

__all__ = ["DIALBACK_PROTOCOL", "REACHABILITY_MODES", "REACHABILITY_PROTOCOL", "Reachability"]

log = logging.getLogger(__name__)

REACHABILITY_PROTOCOL = TProtocol("/p2pinfer/reachability/1.0.0")
DIALBACK_PROTOCOL = TProtocol("/p2pinfer/dialback/1.0.0")
REACHABILITY_MODES = ("auto", "public", "private")

_TICK_S = 1.0
_RETRY_S = 5.0
"""Until a verdict is known, ask again this soon when a peer we never asked is connected.

Where every peer we asked answered ``lan`` (a swarm on one LAN or on loopback),
the next round waits twice as long each time, up to ``interval_s``: each
dial-back costs a fresh connection and Noise handshake on both sides, and
asking the same LAN peers every 5 s forever cost a loopback node about a
third of its idle CPU."""
_SERVE_INTERVAL_S = 10.0
"""A requester may ask this server once per this many seconds."""
_MAX_CONCURRENT_DIALBACKS = 4


_LOCAL_NETS = tuple(
    ipaddress.ip_network(n)
    for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "127.0.0.0/8",
              "169.254.0.0/16", "::1/128", "fc00::/7", "fe80::/10")
)


def is_lan_ip(ip: str) -> bool:
    """An address only a LAN (or this machine) can reach: it says nothing about the internet."""
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return False
    return any(addr in net for net in _LOCAL_NETS if net.version == addr.version)


def _is_tcp(addr: str) -> bool:
    return "/tcp/" in addr and "/p2p-circuit" not in addr and (addr.startswith("/ip4/") or addr.startswith("/ip6/"))


@dataclass
class _Pending:
    server: str
    request_conn: Any
    proved: bool = False
    proof_arrived: trio.Event = field(default_factory=trio.Event)


@dataclass
class Verdict:
    server: str
    result: str
    """``public``, ``private``, ``lan``, ``untrusted`` or ``none`` (refused / no answer)."""
    detail: str
    at: float
    seconds: float = 0.0


class Reachability:
    def __init__(
        self,
        *,
        host: IHost,
        mode: str,
        interval_s: float,
        servers: int,
        dial_timeout_s: float,
        own_addrs: Callable[[], list[str]],
        counters: NodeCounters,
        on_change: Callable[[str], None] = lambda status: None,
    ) -> None:
        if mode not in REACHABILITY_MODES:
            raise ValueError(f"reachability mode {mode!r}: one of {', '.join(REACHABILITY_MODES)}")
        self.host = host
        self.mode = mode
        self.interval_s = interval_s
        self.servers = servers
        self.dial_timeout_s = dial_timeout_s
        self._own_addrs = own_addrs
        self.counters = counters
        self._on_change = on_change
        self.status = "unknown" if mode == "auto" else mode
        self.changed_at: float | None = None if mode == "auto" else time.monotonic()
        self.verdicts: dict[str, Verdict] = {}
        self._pending: dict[bytes, _Pending] = {}
        self._served_at: dict[str, float] = {}
        self._serving = trio.CapacityLimiter(_MAX_CONCURRENT_DIALBACKS)
        self._next_check = 0.0
        self._unknown_wait_s = _RETRY_S
        self._last_check = float("-inf")

    # -- running ---------------------------------------------------------------------------
    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        self.host.set_stream_handler(REACHABILITY_PROTOCOL, self.handle_request)
        self.host.set_stream_handler(DIALBACK_PROTOCOL, self.handle_proof)
        task_status.started()
        if self.mode != "auto":
            await trio.sleep_forever()
        while True:
            await trio.sleep(_TICK_S)
            now = time.monotonic()
            if now >= self._next_check or (self.status == "unknown" and now - self._last_check >= _RETRY_S
                                            and any(p not in self.verdicts for p in self._candidates())):
                await self.check()

    def _candidates(self) -> list[str]:
        """Peers with a direct connection (a relayed request is refused by spec and by us).

        Once one peer has answered ``lan``, peers that reach us over a LAN
        address are left out: they can only answer ``lan`` again. Asking each
        of them in turn cost every node of a LAN or loopback swarm a fresh
        connection and Noise handshake per peer, quadratic in the swarm's
        size while it formed (issue 14)."""
        lan_known = any(v.result == "lan" for v in self.verdicts.values())
        out = []
        for pid in self.host.get_connected_peers():
            direct = [c for c in connections_of(self.host, pid) if not is_relayed(c)]
            if not direct:
                continue
            if lan_known and all(is_lan_ip(remote_ip(c) or "") for c in direct):
                continue
            out.append(pid.to_base58())
        return out

    async def check(self) -> str:
        """Ask up to ``servers`` peers; update and return the status."""
        candidates = self._candidates()
        if not candidates:
            self._next_check = time.monotonic() + _TICK_S
            return self.status
        self._last_check = time.monotonic()
        random.shuffle(candidates)
        # Those not asked for longest first.
        candidates.sort(key=lambda p: self.verdicts[p].at if p in self.verdicts else 0.0)
        async with trio.open_nursery() as nursery:
            for server in candidates[: self.servers]:
                nursery.start_soon(self._ask_and_record, server)
        self._update()
        if self.status != "unknown":
            self._unknown_wait_s = _RETRY_S
            self._next_check = time.monotonic() + self.interval_s
        else:
            self._next_check = time.monotonic() + min(self._unknown_wait_s, self.interval_s)
            self._unknown_wait_s = min(2 * self._unknown_wait_s, self.interval_s)
        return self.status

    async def _ask_and_record(self, server: str) -> None:
        t0 = time.monotonic()
        result, detail = await self.ask(server)
        self.verdicts[server] = Verdict(server, result, detail, time.monotonic(), time.monotonic() - t0)
        log.debug("dial-back by %s: %s (%s) in %.2f s", server, result, detail, time.monotonic() - t0)
        self.counters.reachability_checks[result] += 1

    def _update(self) -> None:
        horizon = time.monotonic() - 2 * self.interval_s - 60
        recent = [v for v in self.verdicts.values() if v.at >= horizon]
        results = {v.result for v in recent}
        status = "public" if "public" in results else "private" if "private" in results else self.status
        if status != self.status:
            log.info("reachability: %s -> %s (%s)", self.status, status,
                     "; ".join(f"{v.server[:12]}: {v.result} {v.detail}" for v in recent))
            self.status = status
            self.changed_at = time.monotonic()
            self._on_change(status)

    async def ask(self, server: str) -> tuple[str, str]:
        """One dial-back request to ``server``: (result, detail)."""
        try:
            answer, proved = await self.exchange(server, [a for a in self._own_addrs() if _is_tcp(a)])
        except trio.TooSlowError:
            return "none", "no answer in time"
        except (WireError, FrameError) as exc:
            return "none", f"bad answer: {exc}"
        except Exception as exc:  # protocol not supported, peer gone, relayed connection
            return "none", f"{type(exc).__name__}: {exc}"
        return self._judge(answer, proved)

    async def exchange(self, server: str, addrs: list[str]) -> tuple[DialBackAnswer, bool]:
        """Ask ``server`` to dial ``addrs``: its answer, and whether its proof came over a fresh connection."""
        nonce = secrets.token_bytes(DIALBACK_NONCE_BYTES)
        stream: INetStream | None = None
        ok = False
        try:
            with trio.fail_after(self.dial_timeout_s * 2 + 20):
                stream = await self.host.new_stream(ID.from_base58(server), [REACHABILITY_PROTOCOL])
                conn = swarm_conn_of(self.host, stream)
                if conn is None or is_relayed(conn):
                    raise ConnectionError("the request would go through a relay")
                pending = self._pending[nonce] = _Pending(server, conn)
                await write_frame(stream, encode_dialback_request(nonce, addrs))
                data = await FrameReader(stream).read_frame(DIALBACK_MAX_BYTES)
                if data is None:
                    raise ConnectionError("the server closed the stream")
                answer = decode_dialback_response(data)
                if answer.status == "ok" and not pending.proved:
                    # The proof is written before the answer; allow for scheduling.
                    with trio.move_on_after(2.0):
                        await pending.proof_arrived.wait()
                ok = True
                return answer, pending.proved
        finally:
            self._pending.pop(nonce, None)
            if stream is not None:
                await finish_stream(stream, ok)

    def _judge(self, answer: DialBackAnswer, proved: bool) -> tuple[str, str]:
        if answer.status == "ok":
            if proved and is_lan_ip(ip_of(answer.addr) or ""):
                return "lan", f"dialled back at LAN address {answer.addr}"
            if proved:
                return "public", f"dialled back at {answer.addr} over a fresh connection"
            self.counters.reachability_untrusted += 1
            return "untrusted", f"said it dialled {answer.addr}, but no proof came over a fresh connection"
        if answer.status in ("failed", "no-match") and is_lan_ip(answer.observed_ip):
            return "lan", f"{answer.status} from a server that sees us at LAN address {answer.observed_ip}"
        if answer.status in ("failed", "no-match"):
            return "private", f"{answer.status}: {answer.message} (seen at {answer.observed_ip or '?'})"
        return "none", f"refused: {answer.message}"

    # -- the client's side of the proof ------------------------------------------------------
    async def handle_proof(self, stream: INetStream) -> None:
        ok = False
        try:
            with trio.fail_after(10):
                data = await FrameReader(stream).read_frame(DIALBACK_MAX_BYTES)
                if data is None:
                    return
                nonce = decode_dialback_proof(data)
                pending = self._pending.get(nonce)
                conn = swarm_conn_of(self.host, stream)
                if pending is not None and conn is not None:
                    fresh = conn is not pending.request_conn
                    inbound = str(getattr(conn, "direction", "")).lower().endswith("inbound")
                    same_server = stream.muxed_conn.peer_id.to_base58() == pending.server
                    if fresh and inbound and same_server and not is_relayed(conn):
                        pending.proved = True
                    pending.proof_arrived.set()
                await write_frame(stream, b"")  # ack: the server may close now
                ok = True
        except (trio.TooSlowError, WireError, FrameError) as exc:
            log.debug("dial-back proof dropped: %s", exc)
        finally:
            await finish_stream(stream, ok)

    # -- serving ------------------------------------------------------------------------------
    async def handle_request(self, stream: INetStream) -> None:
        ok = False
        try:
            peer = stream.muxed_conn.peer_id
            with trio.fail_after(self.dial_timeout_s * 2 + 10):
                data = await FrameReader(stream).read_frame(DIALBACK_MAX_BYTES)
                if data is None:
                    return
                answer = await self._serve(stream, peer, data)
                await write_frame(stream, answer)
                ok = True
        except (trio.TooSlowError, FrameError) as exc:
            log.debug("dial-back request dropped: %s", exc)
        finally:
            await finish_stream(stream, ok)

    async def _serve(self, stream: INetStream, peer: ID, data: bytes) -> bytes:
        try:
            nonce, addrs = decode_dialback_request(data)
        except WireError as exc:
            return encode_dialback_response("refused", message=exc.message)
        conn = swarm_conn_of(self.host, stream)
        if conn is None or is_relayed(conn):
            return encode_dialback_response("refused", message="dial-back requests over a relayed connection are refused")
        try:
            remote = stream.get_remote_address()
            observed = str(ipaddress.ip_address(remote[0])) if remote else None
        except Exception:
            observed = None
        if observed is None:
            return encode_dialback_response("refused", message="cannot see where the request comes from")
        key = peer.to_base58()
        now = time.monotonic()
        if now - self._served_at.get(key, -1e9) < _SERVE_INTERVAL_S:
            return encode_dialback_response("refused", observed_ip=observed, message="asked too often")
        self._served_at[key] = now
        if len(self._served_at) > 4096:
            self._served_at = {k: t for k, t in self._served_at.items() if now - t < _SERVE_INTERVAL_S}
        matching = [a for a in addrs if _is_tcp(a) and ip_of(a) == observed][:4]
        if not matching:
            return encode_dialback_response(
                "no-match", observed_ip=observed, message=f"none of {len(addrs)} addresses is at {observed}"
            )
        async with self._serving:
            for addr in matching:
                if await self._dial_back(peer, addr, nonce):
                    self.counters.dialbacks_served += 1
                    return encode_dialback_response("ok", addr=addr, observed_ip=observed)
        return encode_dialback_response("failed", observed_ip=observed, message=f"could not dial {', '.join(matching)}")

    async def _dial_back(self, peer: ID, addr: str, nonce: bytes) -> bool:
        """Dial ``addr`` on a new connection, hand over the nonce there, close it."""
        before = {id(c) for c in connections_of(self.host, peer)}
        conn = None
        try:
            with trio.fail_after(self.dial_timeout_s):
                conn = await self.host.get_network().dial_addr(multiaddr.Multiaddr(addr), peer)
                if id(conn) in before:  # not fresh: proves nothing, say nothing
                    conn = None
                    return False
                stream = await open_stream_on(self.host, conn, [DIALBACK_PROTOCOL], self.dial_timeout_s)
                ok = False
                try:
                    await write_frame(stream, encode_dialback_proof(nonce))
                    await FrameReader(stream).read_frame(16)  # the client's ack
                    ok = True
                finally:
                    await finish_stream(stream, ok)
                return ok
        except Exception as exc:  # unreachable, refused, timed out, wrong peer
            log.debug("dial-back to %s at %s failed: %s: %s", peer, addr, type(exc).__name__, exc)
            return False
        finally:
            if conn is not None:
                with trio.CancelScope(shield=True), trio.move_on_after(5):
                    try:
                        await conn.close()
                    except Exception:
                        pass

    def as_dict(self) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "status": self.status,
            "mode": self.mode,
            "since_s": None if self.changed_at is None else round(now - self.changed_at, 3),
            "verdicts": {
                v.server: {"result": v.result, "detail": v.detail, "age_s": round(now - v.at, 3),
                           "seconds": round(v.seconds, 3)}
                for v in self.verdicts.values()
            },
        }
