"""``/p2pinfer/generate/1.0.0``: hand a tokenised request to a peer.

One stream carries requests one after another (request; chunks; one final
``done`` or ``error``), so the origin keeps a small pool of open streams per
peer and a forward costs one round trip instead of a stream negotiation
(about 0.5 ms against 3 ms on loopback, measured). Idle streams are closed
by the origin after ``stream_idle_s`` and by the target after twice that;
every exit path closes or resets the stream on both sides.

The target has the last word on load: over its queue threshold, or at
``max_inflight_forwards``, it answers BUSY at once and the origin moves on.
One peer may hold at most ``max_streams_per_peer`` generate streams open to
a node; the next one is answered BUSY ("too many streams") and closed, so a
single peer cannot take every forwarding slot. A stream that carried a BUSY
answer is never pooled: the origin stays away from a busy peer anyway.
A target never forwards again (``max_hops`` bounds what it accepts), so a
request cannot loop.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
import logging
import time

import trio

from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.utils.varint import encode_uvarint

from ..engines.base import (
    Engine,
    EngineError,
    EngineOverloadedError,
    GenerationParams,
    GenerationRecord,
    InvalidRequestError,
    PromptTooLongError,
    TokenChunk,
)
from .config import NodeConfig
from .counters import NodeCounters
from .framing import FrameError, FrameReader, FrameTooLarge, StreamBroken, finish_stream, write_frame
from .other_models import OtherModels
from .wire import (
    RESPONSE_MAX_BYTES,
    Done,
    RemoteError,
    WireError,
    decode_request,
    decode_response,
    encode_chunk,
    encode_done,
    encode_error,
)

__all__ = ["GENERATE_PROTOCOL", "DeadlineExceeded", "ForwardClient", "ForwardFailed", "ForwardServer"]

GENERATE_PROTOCOL = TProtocol("/p2pinfer/generate/1.0.0")
log = logging.getLogger(__name__)


class ForwardFailed(Exception):
    """The forward was lost (dial failure, reset, dead peer, stall, garbage).

    ``started`` says whether any response frame had arrived.
    """

    def __init__(self, message: str, *, started: bool = False) -> None:
        super().__init__(message)
        self.started = started


class DeadlineExceeded(Exception):
    """The request's deadline passed before it completed."""


# -- serving side -------------------------------------------------------------------------


ServeHere = Callable[[list[int], GenerationParams, float], AsyncIterator[TokenChunk | GenerationRecord]]
"""``serve(tokens, params, deadline)``: run a request on this node's engine
(the node's one serving path, shared with its local requests); ``deadline``
on the trio clock, :class:`DeadlineExceeded` past it."""


Delegate = Callable[["Request", float], AsyncIterator[TokenChunk | Done]]
"""``delegate(request, deadline)``: a delegated request (text or messages from
a node that does not serve this model): tokenise it here and route it among
this model's nodes, as a request entering here. Yields chunks, then a
:class:`Done` naming the node that served it; raises the engine's errors
(``InvalidRequestError``, ``EngineOverloadedError``...) for the caller to
answer with."""


class ForwardServer:
    """Answers forwarded requests with ``serve``; ``is_busy()`` is the node's
    valve (queued work over the threshold, or every forwarding slot taken)."""

    def __init__(
        self,
        *,
        engine: Engine,
        fingerprint: str,
        serve: ServeHere,
        config: NodeConfig,
        counters: NodeCounters,
        self_id: str,
        is_busy: Callable[[], bool],
        other_models: OtherModels | None = None,
        delegate: Delegate | None = None,
    ) -> None:
        self.engine = engine
        self._delegate = delegate
        self.fingerprint = fingerprint
        self._serve = serve
        self.config = config
        self.counters = counters
        self.self_id = self_id
        self._is_busy = is_busy
        self._other_models = other_models
        self.inflight = 0
        self.streams: Counter[str] = Counter()
        """Open generate streams per origin peer."""

    async def handle(self, stream: INetStream) -> None:
        peer = _peer(stream)
        self.streams[peer] += 1
        try:
            if self.streams[peer] > self.config.max_streams_per_peer:
                await self._refuse_stream(stream, peer)
                return
            await self._handle(stream)
        finally:
            self.streams[peer] -= 1
            if self.streams[peer] <= 0:
                del self.streams[peer]

    async def _refuse_stream(self, stream: INetStream, peer: str) -> None:
        """Answer BUSY before reading anything, then close: the stream costs no buffer."""
        self._refused("BUSY")
        self.counters.streams_refused += 1
        limit = self.config.max_streams_per_peer
        msg = f"too many streams: {self.streams[peer] - 1} generate streams from {peer} are open; the limit is {limit} per peer"
        ok = await _try_write(stream, encode_error("BUSY", msg))
        await finish_stream(stream, ok)

    async def _handle(self, stream: INetStream) -> None:
        reader = FrameReader(stream)
        ok = True
        try:
            while True:
                data: bytes | None = None
                with trio.move_on_after(self.config.stream_idle_s * 2):
                    try:
                        data = await reader.read_frame(self.config.max_frame_bytes)
                    except FrameTooLarge as exc:
                        # The body is still unread, so the stream cannot be
                        # resynchronised: answer, then end it.
                        self._refused("TOO_LARGE", rejected_frame=True)
                        await _try_write(stream, encode_error("TOO_LARGE", str(exc)))
                        return
                if data is None:  # end of stream, or idle for too long
                    return
                if not await self._serve_one(stream, data):
                    ok = False
                    return
        except FrameError as exc:
            ok = False
            self.counters.frames_rejected += 1
            log.debug("generate stream from %s dropped: %s", _peer(stream), exc)
        finally:
            await finish_stream(stream, ok)

    def _refused(self, code: str, *, rejected_frame: bool = False) -> None:
        self.counters.forwards_refused[code] += 1
        if rejected_frame:
            self.counters.frames_rejected += 1

    async def _serve_one(self, stream: INetStream, data: bytes) -> bool:
        """Answer one request; False when the stream is no longer usable."""
        try:
            req = decode_request(
                data,
                fingerprint=self.fingerprint,
                max_hops=self.config.max_hops,
                max_tokens=self.engine.context_size,
            )
            if not req.delegated:
                self.engine.validate_tokens(req.tokens, req.params)
            elif self._delegate is None:
                raise WireError("BAD_REQUEST", "this node takes no delegated requests")
        except WireError as exc:
            self._refused(exc.code, rejected_frame=exc.code == "BAD_REQUEST")
            if exc.code == "MODEL_MISMATCH" and self._other_models is not None:
                self._other_models.note(_peer(stream), exc.fingerprint, "a forwarded request")
            return await _try_write(stream, encode_error(exc.code, exc.message))
        except PromptTooLongError as exc:
            self._refused("TOO_LARGE")
            return await _try_write(stream, encode_error("TOO_LARGE", str(exc)))
        except InvalidRequestError as exc:
            self._refused("BAD_REQUEST", rejected_frame=True)
            return await _try_write(stream, encode_error("BAD_REQUEST", str(exc)))
        if self._is_busy():
            self._refused("BUSY")
            load = self.engine.load()
            msg = f"{load.queued_prefill_tokens} prefill tokens queued, {self.inflight} forwards in flight"
            return await _try_write(stream, encode_error("BUSY", msg))
        budget = req.deadline_ms / 1000 if req.deadline_ms else self.config.request_timeout_s
        deadline = trio.current_time() + budget
        self.inflight += 1
        try:
            record: GenerationRecord | None = None
            served_by = self.self_id
            source = self._delegate(req, deadline) if req.delegated and self._delegate else self._serve(req.tokens, req.params, deadline)
            # The scope also bounds writing to a slow origin.
            with trio.move_on_at(deadline) as scope:
                async with aclosing(source) as items:
                    async for item in items:
                        if isinstance(item, TokenChunk):
                            await write_frame(stream, encode_chunk(item))
                        elif isinstance(item, Done):
                            record, served_by = item.record, item.served_by
                        else:
                            record = item
            if scope.cancelled_caught or record is None:
                self._refused("DEADLINE")
                return await _try_write(stream, encode_error("DEADLINE", f"not done within {budget:.3f} s"))
            await write_frame(stream, encode_done(record, served_by))
            self.counters.forwards_served += 1
            return True
        except DeadlineExceeded:
            self._refused("DEADLINE")
            return await _try_write(stream, encode_error("DEADLINE", f"not done within {budget:.3f} s"))
        except StreamBroken as exc:
            log.debug("origin %s went away mid-answer: %s", req.origin, exc)
            return False
        except EngineOverloadedError as exc:
            self._refused("BUSY")
            return await _try_write(stream, encode_error("BUSY", str(exc)))
        except PromptTooLongError as exc:  # a delegated request, tokenised here
            self._refused("TOO_LARGE")
            return await _try_write(stream, encode_error("TOO_LARGE", str(exc)))
        except InvalidRequestError as exc:
            self._refused("BAD_REQUEST")
            return await _try_write(stream, encode_error("BAD_REQUEST", str(exc)))
        except EngineError as exc:
            self._refused("INTERNAL")
            log.warning("engine failed a forwarded request: %s", exc)
            return await _try_write(stream, encode_error("INTERNAL", f"engine error: {exc}"))
        finally:
            self.inflight -= 1


async def _try_write(stream: INetStream, payload: bytes) -> bool:
    try:
        await write_frame(stream, payload)
        return True
    except StreamBroken:
        return False


def _peer(stream: INetStream) -> str:
    try:
        return stream.muxed_conn.peer_id.to_base58()
    except Exception:
        return "?"


# -- origin side ------------------------------------------------------------------------------


@dataclass(eq=False)
class _PooledStream:
    stream: INetStream
    reader: FrameReader
    idle_since: float


class ForwardClient:
    """Sends requests to peers over pooled streams."""

    def __init__(
        self,
        *,
        host: IHost,
        config: NodeConfig,
        counters: NodeCounters,
        connect: Callable[[str, float], Awaitable[None]] | None = None,
        path_of_stream: Callable[[str, INetStream], str | None] | None = None,
    ) -> None:
        self.host = host
        self.config = config
        self.counters = counters
        self._connect = connect
        """Opens a connection first, through a relay when the peer is behind NAT (:class:`.paths.Connector`)."""
        self._path_of_stream = path_of_stream
        self._idle: dict[str, list[_PooledStream]] = {}
        self.streams_opened = 0

    async def _open(self, peer_id: str, deadline: float) -> _PooledStream:
        """A new generate stream; opened a second time (reconnecting first) when the first open fails.

        A connection can die under the open (a relay reset the circuit, a NAT
        mapping expired) before py-libp2p notices; the second try then runs on
        a fresh connection, through the connector, instead of losing the forward.
        """
        errors: list[str] = []
        for _ in range(2):
            if self._connect is not None:
                try:
                    await self._connect(peer_id, deadline)
                except Exception as exc:
                    errors.append(f"cannot reach {peer_id}: {exc}")
                    break
            with trio.move_on_at(min(deadline, trio.current_time() + self.config.connect_timeout_s)) as scope:
                try:
                    stream = await self.host.new_stream(ID.from_base58(peer_id), [GENERATE_PROTOCOL])
                except Exception as exc:  # dial and negotiation errors come in many types
                    errors.append(f"cannot open a stream to {peer_id}: {type(exc).__name__}: {exc}")
                    if trio.current_time() >= deadline:
                        break
                    continue
                self.streams_opened += 1
                return _PooledStream(stream, FrameReader(stream), 0.0)
            if scope.cancelled_caught:
                errors.append(f"no stream to {peer_id} within {self.config.connect_timeout_s:.1f} s")
                break
        raise ForwardFailed("; ".join(errors))

    def _release(self, peer_id: str, conn: _PooledStream) -> None:
        conn.idle_since = time.monotonic()
        self._idle.setdefault(peer_id, []).append(conn)

    async def stream(
        self, peer_id: str, request: bytes, *, deadline: float, facts: dict[str, object] | None = None
    ) -> AsyncIterator[TokenChunk | Done]:
        """Yield the peer's chunks then its :class:`Done`.

        ``deadline`` is on the trio clock; ``facts["path"]`` is set to the
        path (direct, hole-punched, relayed) of the stream the request went on,
        and ``facts["stream_bytes"]`` counts the frames written and read on it
        (length prefixes included). Raises :class:`RemoteError` for
        an error record, :class:`ForwardFailed` when the forward was lost and
        :class:`DeadlineExceeded`.
        """
        for attempt in range(2):
            pooled = self._idle.get(peer_id) if attempt == 0 else None
            reused = bool(pooled)
            conn = pooled.pop() if pooled else await self._open(peer_id, deadline)
            if facts is not None and self._path_of_stream is not None:
                facts["path"] = self._path_of_stream(peer_id, conn.stream)
            counted = len(request) + len(encode_uvarint(len(request)))
            reusable = False
            started = False
            try:
                try:
                    try:
                        await write_frame(conn.stream, request)
                    except FrameError as exc:  # e.g. a pooled stream the peer has reset
                        raise ForwardFailed(f"cannot send to {peer_id}: {exc}") from None
                    if facts is not None:
                        facts["stream_bytes"] = counted
                    data = await self._read(conn, peer_id, deadline, started)
                except ForwardFailed:
                    if reused:
                        # The peer had closed its pooled streams (restart,
                        # idle timeout): drop them all, try one fresh stream.
                        await self.drop_peer(peer_id)
                        continue
                    raise
                while True:
                    started = True
                    counted += len(data) + len(encode_uvarint(len(data)))
                    if facts is not None:
                        facts["stream_bytes"] = counted
                    try:
                        item = decode_response(data, peer_id)
                    except WireError as exc:
                        raise ForwardFailed(f"malformed answer from {peer_id}: {exc.message}", started=True) from None
                    if isinstance(item, RemoteError):
                        # After TOO_LARGE the target cannot resynchronise the
                        # stream; after BUSY we stay away (and a stream-limit
                        # refusal is closed by the target).
                        reusable = item.code not in ("TOO_LARGE", "BUSY")
                        raise item
                    if isinstance(item, Done):
                        reusable = True
                        yield item
                        return
                    yield item
                    data = await self._read(conn, peer_id, deadline, started)
            finally:
                if reusable:
                    self._release(peer_id, conn)
                else:
                    await finish_stream(conn.stream, False)
        raise AssertionError("unreachable")

    async def _read(self, conn: _PooledStream, peer_id: str, deadline: float, started: bool) -> bytes:
        stall = trio.current_time() + self.config.stall_timeout_s
        with trio.move_on_at(min(deadline, stall)):
            try:
                data = await conn.reader.read_frame(RESPONSE_MAX_BYTES)
            except FrameError as exc:
                raise ForwardFailed(f"stream to {peer_id} broke: {exc}", started=started) from None
            if data is None:
                raise ForwardFailed(f"{peer_id} closed the stream before finishing", started=started)
            return data
        if trio.current_time() >= deadline:
            raise DeadlineExceeded(f"deadline passed waiting for {peer_id}")
        raise ForwardFailed(f"{peer_id} sent nothing for {self.config.stall_timeout_s:.1f} s", started=started)

    async def drop_peer(self, peer_id: str) -> None:
        for conn in self._idle.pop(peer_id, []):
            await finish_stream(conn.stream, True)

    async def close_idle(self, older_than_s: float) -> None:
        now = time.monotonic()
        for peer_id in list(self._idle):
            keep = []
            for conn in self._idle.get(peer_id, []):
                if now - conn.idle_since > older_than_s or conn.stream.is_closed:
                    await finish_stream(conn.stream, True)
                else:
                    keep.append(conn)
            if keep:
                self._idle[peer_id] = keep
            else:
                self._idle.pop(peer_id, None)

    def idle_streams(self) -> int:
        return sum(len(v) for v in self._idle.values())

    async def run_janitor(self) -> None:
        while True:
            await trio.sleep(self.config.stream_idle_s / 2)
            await self.close_idle(self.config.stream_idle_s)

    async def aclose(self) -> None:
        for peer_id in list(self._idle):
            await self.drop_peer(peer_id)
