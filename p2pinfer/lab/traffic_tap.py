"""What a node writes on each connection, by peer, path and cause (a lab diagnostic).

:func:`install` patches, in this process only, py-libp2p's yamux frame writer
(every frame a connection sends: data, window updates, pings, stream
open/close), ``NetStream.set_protocol`` (which protocol each yamux stream
carries) and ``Pubsub.write_msg`` (the kinds of pubsub RPCs, by peer).
:func:`read` sums what was written since :func:`install` (or the last
``reset``), by (peer, path, cause):

* ``frames``: yamux frames by type and, for data frames, by protocol
  (``negotiation`` for bytes written before the stream's protocol was
  agreed); each frame's bytes include its 12-byte yamux header and the
  18 bytes of its Noise message (2-byte length, 16-byte tag), which is what
  a relay copies for a relayed connection;
* ``pubsub``: RPCs and bytes (protobuf) by kind (:func:`.net.host.rpc_kinds`).

Used by docs/results/issue17-relay-idle/relay_idle.py (``traffic_tap`` and
``traffic`` commands of the scripted node). Not for production nodes.
"""

from __future__ import annotations

from collections import Counter
import struct
import weakref
from typing import Any

__all__ = ["install", "read"]

_NOISE_OVERHEAD = 18
_HEADER = ">BBHII"
_TYPES = {0: "data", 1: "window_update", 2: "ping", 3: "go_away"}

_state: dict[str, Any] = {}


def install(host: Any) -> None:
    """Start counting (idempotent; a second call resets the counts)."""
    if _state:
        _state["frames"].clear()
        _state["pubsub"].clear()
        _state["events"].clear()
        return
    from libp2p.network.stream.net_stream import NetStream
    from libp2p.pubsub.pubsub import Pubsub
    from libp2p.stream_muxer.yamux.yamux import Yamux

    from ..net.host import rpc_kinds

    frames: Counter[tuple[int, int, str]] = Counter()
    """(id of the Yamux, stream id, frame kind) -> bytes (frame + Noise)."""
    pubsub: Counter[tuple[int, str, str]] = Counter()
    conns: dict[int, Any] = {}
    """id(Yamux) -> weak reference to it, for its peer and path at read time."""
    protocols: dict[tuple[int, int], str] = {}
    _state.update(host=host, frames=frames, pubsub=pubsub, conns=conns, protocols=protocols, peers={})

    def note(muxed: Any) -> int:
        key = id(muxed)
        if key not in conns:
            conns[key] = weakref.ref(muxed)
            _state["peers"][key] = str(getattr(muxed, "peer_id", "?"))
        return key

    original_write_frame = Yamux._write_frame

    async def write_frame(self: Any, data: bytes) -> None:
        try:
            _, typ, flags, sid, _length = struct.unpack(_HEADER, data[:12])
            kind = _TYPES.get(typ, str(typ))
            if typ == 0 and len(data) == 12:
                kind = "data_empty"  # SYN/FIN/RST without payload
            frames[(note(self), sid, kind)] += len(data) + _NOISE_OVERHEAD
            frames[(note(self), sid, kind + "#")] += 1
        except Exception:
            _state.setdefault("errors", []).append(__import__("traceback").format_exc()[-600:])
        await original_write_frame(self, data)

    original_set_protocol = NetStream.set_protocol

    def set_protocol(self: Any, protocol_id: Any) -> None:
        try:
            muxed_stream = self.muxed_stream
            protocols[(note(self.muxed_conn), muxed_stream.stream_id)] = str(protocol_id)
        except Exception:
            pass
        original_set_protocol(self, protocol_id)

    original_write_msg = Pubsub.write_msg

    async def write_msg(self: Any, stream: Any, rpc_msg: Any) -> bool:
        # CountingPubsub.write_msg strips the signed record, then calls this: counted as sent.
        ok = await original_write_msg(self, stream, rpc_msg)
        try:
            key = note(stream.muxed_conn)
            kinds = rpc_kinds(rpc_msg)
            for kind in kinds:
                pubsub[(key, kind, "rpcs")] += 1
            pubsub[(key, kinds[0], "bytes")] += rpc_msg.ByteSize()
        except Exception:
            pass
        return ok

    # Why pubsub streams end and are opened again: (peer, event, where) -> count.
    events: Counter[tuple[str, str, str]] = Counter()
    _state["events"] = events
    original_dead = Pubsub._handle_dead_peer

    def handle_dead_peer(self: Any, peer_id: Any) -> None:
        import sys

        frames_up = []
        f = sys._getframe(1)
        while f is not None and len(frames_up) < 3:
            frames_up.append(f.f_code.co_name)
            f = f.f_back
        exc = sys.exc_info()[1]
        where = "<".join(frames_up) + (f" ({type(exc).__name__}: {str(exc)[:80]})" if exc is not None else "")
        events[(str(peer_id), "dead_peer", where)] += 1
        original_dead(self, peer_id)

    original_new = Pubsub._handle_new_peer

    async def handle_new_peer(self: Any, peer_id: Any) -> None:
        had = peer_id in self.peers
        try:
            await original_new(self, peer_id)
            events[(str(peer_id), "new_peer", "had stream" if had else "opened")] += 1
        except BaseException as exc:
            events[(str(peer_id), "new_peer", f"failed {type(exc).__name__}: {str(exc)[:80]}")] += 1
            raise

    original_read = Pubsub.continuously_read_stream

    async def continuously_read_stream(self: Any, stream: Any) -> None:
        peer = str(stream.muxed_conn.peer_id)
        events[(peer, "inbound_stream", "started")] += 1
        try:
            await original_read(self, stream)
            events[(peer, "inbound_stream", "returned")] += 1
        except BaseException as exc:
            events[(peer, "inbound_stream", f"{type(exc).__name__}: {str(exc)[:80]}")] += 1
            raise

    Pubsub._handle_dead_peer = handle_dead_peer
    Pubsub._handle_new_peer = handle_new_peer
    Pubsub.continuously_read_stream = continuously_read_stream
    Yamux._write_frame = write_frame
    NetStream.set_protocol = set_protocol
    Pubsub.write_msg = write_msg
    # Streams opened before now: their protocols too.
    try:
        for held in list(host.get_network().connections.values()):
            for conn in held if isinstance(held, (list, tuple, set)) else [held]:
                for stream in conn.get_streams():
                    proto = stream.get_protocol()
                    if proto is not None:
                        protocols[(note(stream.muxed_conn), stream.muxed_stream.stream_id)] = str(proto)
    except Exception:
        _state.setdefault("errors", []).append(__import__("traceback").format_exc()[-600:])


def _path(host: Any, muxed: Any) -> str:
    from ..net.connections import is_relayed

    if muxed is None:
        return "closed"
    try:
        for conn in host.get_network().get_connections(muxed.peer_id):
            if getattr(conn, "muxed_conn", None) is muxed:
                return "relayed" if is_relayed(conn) else "direct"
    except Exception:
        pass
    return "closed"


def read(reset: bool = False) -> dict[str, Any]:
    """{peer: {path: {"frames": {cause: bytes}, "frame_counts": {...}, "pubsub": {...}}}} since install."""
    if not _state:
        return {}
    host = _state["host"]
    out: dict[str, Any] = {}
    paths: dict[int, str] = {}

    def slot(key: int) -> dict[str, Any]:
        if key not in paths:
            ref = _state["conns"].get(key)
            paths[key] = _path(host, ref() if ref is not None else None)
        peer = _state["peers"].get(key, "?")
        return out.setdefault(peer, {}).setdefault(
            paths[key], {"frames": Counter(), "frame_counts": Counter(), "pubsub": Counter()})

    for (key, sid, kind), value in _state["frames"].items():
        counted = kind.endswith("#")
        base = kind.rstrip("#")
        cause = base
        if base in ("data", "data_empty", "window_update"):
            proto = _state["protocols"].get((key, sid), "negotiation" if base == "data" else "unknown")
            if sid == 0:
                proto = "session"
            cause = f"{base} {proto}"
        s = slot(key)
        (s["frame_counts"] if counted else s["frames"])[cause] += value
    for (key, kind, what), value in _state["pubsub"].items():
        slot(key)["pubsub"][f"{kind} {what}"] += value
    for (peer, event, where), value in _state["events"].items():
        out.setdefault(peer, {}).setdefault("pubsub_events", {})[f"{event}: {where}"] = value
    if reset:
        _state["events"].clear()
        _state["frames"].clear()
        _state["pubsub"].clear()
    return {p: {path: ({k: dict(v) for k, v in d.items()} if path != "pubsub_events" else d) for path, d in by.items()}
            for p, by in out.items()}
