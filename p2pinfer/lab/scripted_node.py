"""A node in its own process, driven by JSON lines on stdin/stdout.

Used by the multi-process tests and ``p2pinfer bench overlay``: the first
stdin line is the :class:`~p2pinfer.net.config.NodeConfig` as JSON; the node
answers ``{"event": "ready", ...}`` once it listens. Then each line
``{"id": n, "cmd": ..., ...}`` gets one reply line ``{"id": n, "ok": ...}``
(commands run concurrently; ``generate`` with ``"stream": true`` also sends
``{"id": n, "event": "chunk"}`` lines). Closing stdin or ``shutdown`` stops
the node cleanly and the process exits 0. With ``--lying`` the node runs
the lab's :class:`~p2pinfer.lab.lying.LyingRouter`; with ``--wrong-tokens
MODE`` it serves with :class:`~p2pinfer.lab.wrong_tokens.WrongTokenEngine`
(answers of random tokens or of another model).

The debugging commands (``send_raw``, ``publish_raw``) exist to prove that
malformed input from a peer is rejected: they let one real node misbehave
on the wire towards the others.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import sys
import time
from typing import Any

import trio

from ..core.peers import Load
from ..core.router import Router
from ..engines.base import GenerationParams, TokenChunk
from ..node import GenerateResult, Node, RequestFailed
from ..net.config import NodeConfig
from ..net.wire import GENERATE_VERSION
from .lying import LyingRouter

log = logging.getLogger("p2pinfer.lab.scripted_node")


class Controller:
    def __init__(self, node: Node, out: trio.abc.SendStream) -> None:
        self.node = node
        self._out = out
        self._lock = trio.Lock()
        self.stop = trio.Event()

    async def send(self, obj: dict[str, Any]) -> None:
        data = (json.dumps(obj, default=str) + "\n").encode()
        async with self._lock:
            await self._out.send_all(data)

    async def handle(self, line: str) -> None:
        msg_id = None
        try:
            msg = json.loads(line)
            msg_id = msg.get("id")
            handler = getattr(self, "cmd_" + str(msg.get("cmd")), None)
            if handler is None:
                raise ValueError(f"unknown command {msg.get('cmd')!r}")
            result = await handler(msg_id, **{k: v for k, v in msg.items() if k not in ("id", "cmd")})
            await self.send({"id": msg_id, "ok": True, "result": result})
        except Exception as exc:
            await self.send({"id": msg_id, "ok": False, "error": f"{type(exc).__name__}: {exc}", "type": type(exc).__name__})

    # -- commands ----------------------------------------------------------------------------
    async def cmd_info(self, _id: Any) -> dict[str, Any]:
        return {"peer_id": self.node.peer_id, "addrs": self.node.addrs, "pid": os.getpid()}

    async def cmd_status(self, _id: Any) -> dict[str, Any]:
        return self.node.status()

    async def cmd_shutdown(self, _id: Any) -> None:
        self.stop.set()

    async def cmd_generate(
        self,
        msg_id: Any,
        tokens: list[int] | None = None,
        prompt: str | None = None,
        prefer: str | None = None,
        stream: bool = False,
        deadline_s: float | None = None,
        **params: Any,
    ) -> dict[str, Any]:
        source: Any = tokens if tokens is not None else prompt
        if "stop" in params:
            params["stop"] = tuple(params["stop"])
        t0 = time.perf_counter()
        try:
            async for item in self.node.generate(source, GenerationParams(**params), prefer=prefer, timeout_s=deadline_s):
                if isinstance(item, TokenChunk):
                    if stream:
                        await self.send({"id": msg_id, "event": "chunk", "tokens": list(item.token_ids)})
                elif isinstance(item, GenerateResult):
                    out = item.as_dict()
                    out["call_s"] = time.perf_counter() - t0
                    out["done_at"] = time.monotonic()  # CLOCK_MONOTONIC: comparable across processes
                    return out
        except RequestFailed as exc:
            raise RuntimeError(f"{exc} attempts={[a.as_dict() for a in exc.attempts]}") from None
        raise RuntimeError("no result")

    async def cmd_cache_hashes(self, _id: Any) -> list[int]:
        """Block hashes of what this node's engine really caches (not of its digest)."""
        hasher = self.node.router.hasher
        out: set[int] = set()
        for seq in self.node.engine.cache.sequences():
            out.update(hasher.hashes(seq))
        return sorted(out)

    async def cmd_view_hashes(self, _id: Any, peer: str) -> list[int] | None:
        state = self.node.router.view.get(peer)
        return None if state is None else sorted(state.hashes)

    async def cmd_pull_digest(self, _id: Any, peer: str) -> bool:
        """Pull ``peer``'s digest now (what a node does when it falls behind)."""
        return await self.node.puller.pull(peer)

    async def cmd_view(self, _id: Any) -> dict[str, Any]:
        now = time.monotonic()
        view = self.node.router.view
        return {
            p.peer_id: {"eligible": view.eligible(p, now), "busy": p.backing_off(now), "blocks": len(p.hashes), "rtt_ms": p.rtt_ms,
                        "last_seen_s": round(now - p.last_seen, 3)}
            for p in view
        }

    # -- the prefix directory (discovery directory or auto) -----------------------------------
    def _directory(self) -> Any:
        if self.node.directory is None:
            raise RuntimeError("this node runs discovery 'gossip': it has no directory")
        return self.node.directory

    async def cmd_directory(self, _id: Any, tokens: list[int] | None = None) -> dict[str, Any]:
        """The directory's status; with ``tokens``: their anchor, its owners as this
        node places them, and the holders this node's store lists for it."""
        d = self._directory()
        out = d.status()
        out["members_list"] = d.placement.members()
        if tokens is not None:
            anchor = d.anchor(self.node.router.hasher.hashes(tokens))
            out["anchor"] = anchor
            out["owners"] = [] if anchor is None else d.placement.owners(anchor)
            out["holders"] = {} if anchor is None else {h: len(b) for h, b in d.store.holders(anchor).items()}
            out["held_blocks"] = 0 if anchor is None else len(d.tracker.held(anchor))
        return out

    async def cmd_directory_lookup(self, _id: Any, tokens: list[int]) -> list[dict[str, Any]] | None:
        """What a lookup for ``tokens`` answers now: holders with their matched blocks."""
        hashes = self.node.router.hasher.hashes(tokens)
        found = await self._directory().lookup(hashes, len(tokens))
        if found is None:
            return None
        answer, owner = found
        return [{"holder": h.holder, "owner": owner, "match_blocks": h.match_blocks, "queued": h.load.queued_prefill_tokens, "age_s": h.age_s} for h in answer.holders]

    async def cmd_directory_flush(self, _id: Any) -> None:
        """Send pending anchor changes now (instead of at the next update tick)."""
        await self._directory().flush()

    async def cmd_directory_refresh(self, _id: Any) -> None:
        """A checksum refresh now (instead of at the next refresh tick)."""
        await self._directory().refresh()

    async def cmd_directory_lose(self, _id: Any, holder: str, tokens: list[int], blocks: int = 1) -> int:
        """Fault: this owner loses the last ``blocks`` block registrations of
        ``holder`` under the anchor of ``tokens``, as if those register updates
        never arrived. Returns the blocks still registered."""
        d = self._directory()
        hashes = self.node.router.hasher.hashes(tokens)
        anchor = d.anchor(hashes)
        assert anchor is not None, "tokens shorter than the anchor"
        from ..core.directory import AnchorUpdate, Register

        held = d.store.holders(anchor).get(holder, frozenset())
        lost = frozenset(h for h in hashes[-blocks:] if h in held)
        info = d.store.holder_info(holder)
        assert info is not None, f"{holder} registered nothing here"
        d.store.apply(Register(holder, info[0], info[1], (AnchorUpdate(anchor, False, frozenset(), lost),)), time.monotonic())
        return len(d.store.holders(anchor).get(holder, frozenset()))

    async def cmd_directory_lie(self, _id: Any, victims: list[str]) -> None:
        """Fault: from now on this owner answers every query with one of
        ``victims`` (in turn) holding the whole prompt, whatever was
        registered: a lying owner that sends entries to peers that cache
        nothing of it (docs/security.md)."""
        from ..core.directory import Answer, AnswerHolder

        d = self._directory()
        turn = itertools.count()

        def lie(query: Any, now: float, exclude: str = "") -> Answer:
            names = [v for v in victims if v != exclude]
            if not names:
                return Answer(query.anchor, ())
            victim = names[next(turn) % len(names)]
            return Answer(query.anchor, (AnswerHolder(victim, query.depths()[-1], Load(), 0.0),))

        d.store.answer = lie  # type: ignore[method-assign]

    async def cmd_wait_hash(self, _id: Any, peer: str, hash: int, timeout_s: float = 10.0) -> float:
        """Poll (1 ms) until our view of ``peer`` holds ``hash``; returns time.monotonic()."""
        with trio.fail_after(timeout_s):
            while True:
                state = self.node.router.view.get(peer)
                if state is not None and hash in state.hashes:
                    return time.monotonic()
                await trio.sleep(0.001)

    async def cmd_send_raw(
        self, _id: Any, peer: str, data_hex: str, protocol: str = "/p2pinfer/generate/1.0.0", close: bool = True, timeout_s: float = 10.0
    ) -> dict[str, Any]:
        """Write raw bytes on a new stream to ``peer``; return the frames that came back."""
        from libp2p.custom_types import TProtocol
        from libp2p.peer.id import ID

        from ..net.framing import FrameError, FrameReader, finish_stream
        from ..net.proto import p2pinfer_pb2 as pb
        from ..net.wire import ERROR_CODES

        stream = await self.node.host.new_stream(ID.from_base58(peer), [TProtocol(protocol)])
        frames: list[dict[str, Any]] = []
        ended = "timeout"
        try:
            await stream.write(bytes.fromhex(data_hex))
            if close:
                await stream.close_write()
            reader = FrameReader(stream)
            with trio.move_on_after(timeout_s):
                while True:
                    try:
                        frame = await reader.read_frame(1 << 20)
                    except FrameError as exc:
                        ended = f"broken: {exc}"
                        break
                    if frame is None:
                        ended = "eof"
                        break
                    resp = pb.GenerateResponse()
                    resp.ParseFromString(frame)
                    kind = resp.WhichOneof("body")
                    if kind == "error":
                        frames.append({"error": ERROR_CODES[resp.error.code], "message": resp.error.message})
                    else:
                        frames.append({"kind": kind})
        finally:
            await finish_stream(stream, False)
        return {"frames": frames, "ended": ended}

    async def cmd_flood_streams(
        self, _id: Any, peer: str, n: int, tokens: list[int], max_tokens: int = 200, hold_s: float = 0.0
    ) -> list[dict[str, Any]]:
        """Open ``n`` generate streams to ``peer`` at once, one request on each.

        Returns the first answer frame of each (a chunk or an error), after
        holding the streams open for ``hold_s``; then resets them all.
        """
        from libp2p.peer.id import ID

        from ..net.forward import GENERATE_PROTOCOL
        from ..net.framing import FrameError, FrameReader, finish_stream, write_frame
        from ..net.wire import decode_response, encode_request

        answers: list[dict[str, Any]] = [{} for _ in range(n)]
        streams: list[Any] = []
        request = encode_request(
            request_id=b"flood-request-id", tokens=tokens, params=GenerationParams(max_tokens=max_tokens), hops=1,
            deadline_ms=60_000, fingerprint=self.node.router.fingerprint_hex, predicted_match_tokens=0,
            origin=self.node.peer_id,
        )

        async def one(i: int) -> None:
            stream = await self.node.host.new_stream(ID.from_base58(peer), [GENERATE_PROTOCOL])
            streams.append(stream)
            try:
                await write_frame(stream, request)
                frame = await FrameReader(stream).read_frame(1 << 20)
                item = None if frame is None else decode_response(frame)
            except FrameError as exc:
                answers[i] = {"broken": str(exc)}
                return
            if item is None:
                answers[i] = {"eof": True}
            elif isinstance(item, Exception):
                answers[i] = {"error": item.code, "message": item.message}
            else:
                answers[i] = {"kind": type(item).__name__}

        try:
            with trio.fail_after(30):
                async with trio.open_nursery() as nursery:
                    for i in range(n):
                        nursery.start_soon(one, i)
            await trio.sleep(hold_s)
        finally:
            for stream in streams:
                await finish_stream(stream, False)
        return answers

    # -- NAT testbed (p2pinfer lab nat) -----------------------------------------------------
    async def cmd_relay_capture(self, _id: Any, max_bytes: int = 1 << 20) -> None:
        """Start keeping (up to ``max_bytes`` of) every byte this node copies as a relay."""
        captured = self._captured = bytearray()

        def tap(src: str, dst: str, data: bytes) -> None:
            if len(captured) < max_bytes:
                captured.extend(data[: max_bytes - len(captured)])

        self.node.relay.taps[:] = [tap]

    async def cmd_traffic_tap(self, _id: Any) -> None:
        """Start counting what this node writes per connection and cause (:mod:`.traffic_tap`),
        and the chunks it copies as a relay, per direction."""
        from . import traffic_tap

        traffic_tap.install(self.node.host)
        chunks = self._relay_chunks = {}

        def tap(src: str, dst: str, data: bytes) -> None:
            entry = chunks.setdefault(f"{src}>{dst}", {"chunks": 0, "bytes": 0, "sizes": {}})
            entry["chunks"] += 1
            entry["bytes"] += len(data)
            size = str(len(data))
            entry["sizes"][size] = entry["sizes"].get(size, 0) + 1

        self.node.relay.taps[:] = [tap]

    async def cmd_traffic(self, _id: Any) -> dict[str, Any]:
        from . import traffic_tap

        m = self.node.membership
        now = time.monotonic()
        return {
            "now": now,
            "by_peer": traffic_tap.read(),
            "tap_debug": {k: len(v) for k, v in traffic_tap._state.items() if hasattr(v, "__len__")} | {"errors": traffic_tap._state.get("errors", [])[:5]},
            "relay_chunks": getattr(self, "_relay_chunks", {}),
            "keepalive_wanted": m.keepalive_wanted(),
            "connections_changed_ago_s": round(now - m._connections_changed_at, 3),
            "view_not_connected": [s.peer_id for s in self.node.router.view if s.peer_id not in m._connected],
            "view": [s.peer_id for s in self.node.router.view],
        }

    async def cmd_relay_captured(self, _id: Any) -> dict[str, Any]:
        captured = getattr(self, "_captured", bytearray())
        return {"hex": bytes(captured).hex(), "bytes": len(captured)}

    async def cmd_nat(self, _id: Any) -> dict[str, Any]:
        """Reachability, relay and path facts with ``time.monotonic()`` stamps (comparable across processes)."""
        node = self.node
        return {
            "now": time.monotonic(),
            "started_at": node.started_at,
            "reachability": node.reachability.status,
            "reachability_changed_at": node.reachability.changed_at,
            "relay_events": list(node.relay_reservations.events),
            "first_reserved_at": node.relay_reservations.first_reserved_at,
            "reservations": [r.relay for r in node.relay_reservations.reservations.values()],
            "circuit_addrs": node.relay_reservations.circuit_addrs(),
            "paths": dict(node.paths.paths),
            # The circuit addresses each peer's gossip gave us (what we dial it through).
            "relay_addrs_heard": {peer: node.membership.addrs_of(peer)[1]
                                  for peer in {*node.paths.paths, *(p.peer_id for p in node.router.view)}},
            "rtt_paths": dict(node.membership.rtt_paths),
            "hole_punches": [r.__dict__ for r in node.hole_puncher.records] if node.hole_puncher else [],
            "relay": node.relay.as_dict(),
        }

    async def cmd_rcmgr(self, _id: Any) -> dict[str, Any]:
        """py-libp2p's resource manager, as it stands: counts, limits, circuit breaker."""
        rm = getattr(self.node.host.get_network(), "_resource_manager", None) or getattr(
            self.node.host.get_network(), "resource_manager", None)
        if rm is None:
            return {"resource_manager": None}
        cb = rm.circuit_breaker
        return {
            "connections": rm._current_connections, "streams": rm._current_streams, "memory": rm._current_memory,
            "limits": {k: v for k, v in vars(rm.limits).items() if isinstance(v, (int, float))},
            "circuit_breaker": None if cb is None else {"state": cb.state.value, "failures": cb.failure_count},
        }

    async def cmd_conns(self, _id: Any) -> dict[str, list[dict[str, Any]]]:
        """Every open connection, by peer: direction, transport addresses, streams."""
        net = self.node.host.get_network()
        out: dict[str, list[dict[str, Any]]] = {}
        for pid, conns in net.connections.items():
            out[pid.to_base58()] = [
                {
                    "direction": str(getattr(c, "direction", "")),
                    "addrs": [str(a) for a in c.get_transport_addresses()],
                    "closed": c.is_closed,
                    "streams": len(c.get_streams()),
                    "protocols": sorted({str(s.get_protocol()) for s in c.get_streams()}),
                }
                for c in conns
            ]
        return out

    async def cmd_probe_stream(self, _id: Any, peer: str, protocol: str = "/ipfs/ping/1.0.0") -> dict[str, Any]:
        """Time opening (negotiating) one stream to ``peer``: which connection, how long."""
        from libp2p.custom_types import TProtocol
        from libp2p.peer.id import ID

        from ..net.connections import swarm_conn_of
        from ..net.framing import finish_stream

        t0 = time.perf_counter()
        try:
            with trio.fail_after(20):
                stream = await self.node.host.new_stream(ID.from_base58(peer), [TProtocol(protocol)])
        except Exception as exc:
            return {"ok": False, "s": time.perf_counter() - t0, "error": f"{type(exc).__name__}: {exc}"}
        conn = swarm_conn_of(self.node.host, stream)
        addrs = [str(a) for a in conn.get_transport_addresses()] if conn is not None else None
        await finish_stream(stream, True)
        return {"ok": True, "s": time.perf_counter() - t0, "conn": addrs}

    async def cmd_ping_peer(self, _id: Any, peer: str, n: int = 20) -> dict[str, Any]:
        """``n`` pings to ``peer`` on the connection new streams use now: RTTs in ms and that path."""
        from libp2p.host.ping import ID as PING_PROTOCOL
        from libp2p.io.utils import read_exactly
        from libp2p.peer.id import ID

        from ..net.framing import finish_stream

        stream = await self.node.host.new_stream(ID.from_base58(peer), [PING_PROTOCOL])
        rtts = []
        try:
            for _ in range(n):
                payload = os.urandom(32)
                t0 = time.perf_counter()
                await stream.write(payload)
                await read_exactly(stream, 32)
                rtts.append((time.perf_counter() - t0) * 1000)
        finally:
            path = self.node._path_of_stream(peer, stream)
            await finish_stream(stream, True)
        return {"rtt_ms": rtts, "path": path}

    async def cmd_publish_raw(self, _id: Any, data_hex: str, topic: str | None = None) -> None:
        """Publish bytes as they are, on the model topic or on ``topic``."""
        await self.node._libp2p.pubsub.publish(topic or self.node.topic, bytes.fromhex(data_hex))

    async def cmd_gossip_digest_hex(self, _id: Any) -> str:
        """This node's full digest as a gossip payload (for ``publish_raw`` on the wrong topic)."""
        from ..net.wire import encode_gossip_digest

        return encode_gossip_digest(self.node.router.full_digest()).hex()

    async def cmd_encode_request(self, _id: Any, **fields: Any) -> str:
        """A GenerateRequest frame for ``send_raw`` (any field may be set, even wrongly)."""
        from ..net.framing import encode_frame
        from ..net.proto import p2pinfer_pb2 as pb
        from ..net.wire import params_to_pb

        params = fields.pop("params", {})
        params.setdefault("max_tokens", 4)
        fields.setdefault("version", GENERATE_VERSION)
        fields.setdefault("request_id", b"r" * 16)
        fields.setdefault("hops", 1)
        fields.setdefault("model_fingerprint", self.node.router.fingerprint_hex)
        if isinstance(fields["request_id"], str):
            fields["request_id"] = fields["request_id"].encode()
        msg = pb.GenerateRequest(params=params_to_pb(GenerationParams(**params)), **fields)
        return encode_frame(msg.SerializeToString()).hex()


async def _serve(config: NodeConfig, lying: bool, wrong_tokens: str | None = None) -> None:
    stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
    stdout = trio.lowlevel.FdStream(os.dup(sys.stdout.fileno()))
    router_factory: Any = Router
    if lying:
        router_factory = LyingRouter
        log.warning("lying node: it advertises prefixes it does not hold (test only)")
    engine = None
    if wrong_tokens:
        from ..engines.registry import load_engine
        from .wrong_tokens import WrongTokenEngine

        engine = WrongTokenEngine(load_engine(config.engine, **dict(config.engine_options)), wrong_tokens)
        log.warning("wrong-token node: its answers are %s tokens (test only)", wrong_tokens)
    try:
        await _run_node(Node(config, engine=engine, router_factory=router_factory), stdin, stdout)
    finally:
        if engine is not None:
            await engine.aclose()


async def _run_node(node_obj: Node, stdin: Any, stdout: Any) -> None:
    async with node_obj as node:
        ctl = Controller(node, stdout)
        await ctl.send({"event": "ready", "peer_id": node.peer_id, "addrs": node.addrs, "pid": os.getpid()})
        async with trio.open_nursery() as nursery:

            async def read_commands() -> None:
                buf = b""
                while True:
                    data = await stdin.receive_some(65536)
                    if not data:
                        ctl.stop.set()
                        return
                    buf += data
                    while b"\n" in buf:
                        line, buf = buf.split(b"\n", 1)
                        if line.strip():
                            nursery.start_soon(ctl.handle, line.decode())

            nursery.start_soon(read_commands)
            await ctl.stop.wait()
            nursery.cancel_scope.cancel()
    await stdout.send_all(b'{"event": "stopped"}\n')


def _first_line() -> bytes:
    # Byte by byte from the fd: a buffered reader could swallow the commands
    # that follow, which the trio stream reads later.
    out = bytearray()
    while not out.endswith(b"\n"):
        byte = os.read(sys.stdin.fileno(), 1)
        if not byte:
            break
        out += byte
    return bytes(out)


def main() -> None:
    logging.basicConfig(
        level=os.environ.get("P2PINFER_LOG", "WARNING"),
        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    config = NodeConfig.from_dict(json.loads(_first_line()))
    args = sys.argv[1:]
    wrong = args[args.index("--wrong-tokens") + 1] if "--wrong-tokens" in args else None
    trio.run(_serve, config, "--lying" in args, wrong)


if __name__ == "__main__":
    main()
