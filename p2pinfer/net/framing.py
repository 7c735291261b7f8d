"""Varint length-prefixed frames on a libp2p stream, with a hard size limit.

The limit is checked against the length prefix *before* the body is read,
so a peer that announces a 4 GB frame costs us ten bytes, not 4 GB. Reads
are buffered because a libp2p stream ``read(n)`` returns whatever is
available (a short read), not exactly ``n`` bytes.
"""

from __future__ import annotations

from typing import Any, Protocol

import trio

from libp2p.io.exceptions import IOException
from libp2p.network.stream.exceptions import StreamEOF
from libp2p.stream_muxer.exceptions import MuxedStreamEOF, MuxedStreamError
from libp2p.utils.varint import encode_uvarint

__all__ = ["FrameError", "FrameReader", "FrameTooLarge", "StreamBroken", "encode_frame", "finish_stream", "write_frame"]

_READ_CHUNK = 64 * 1024
_MAX_VARINT = 10


class FrameError(Exception):
    """The peer sent something that is not a valid frame."""


class FrameTooLarge(FrameError):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"frame of {size} bytes exceeds the limit of {limit}")
        self.size = size
        self.limit = limit


class StreamBroken(FrameError):
    """The stream ended (reset, closed, connection lost) in the middle of a frame."""


class _Readable(Protocol):
    async def read(self, n: int | None = None) -> bytes: ...


class _Writable(Protocol):
    async def write(self, data: bytes) -> None: ...


def encode_frame(payload: bytes) -> bytes:
    return encode_uvarint(len(payload)) + payload


async def write_frame(stream: _Writable, payload: bytes) -> None:
    try:
        await stream.write(encode_frame(payload))
    except (IOException, MuxedStreamError) as exc:
        raise StreamBroken(f"write failed: {type(exc).__name__}: {exc}") from None


class FrameReader:
    """Reads successive frames from one stream (keeps the bytes read ahead)."""

    __slots__ = ("_stream", "_buf", "_eof", "bytes_read")

    def __init__(self, stream: _Readable) -> None:
        self._stream = stream
        self._buf = bytearray()
        self._eof = False
        self.bytes_read = 0

    async def _fill(self) -> bool:
        if self._eof:
            return False
        try:
            data = await self._stream.read(_READ_CHUNK)
        except (StreamEOF, MuxedStreamEOF):
            data = b""
        except (IOException, MuxedStreamError) as exc:
            raise StreamBroken(f"read failed: {type(exc).__name__}: {exc}") from None
        if not data:
            self._eof = True
            return False
        self.bytes_read += len(data)
        self._buf += data
        return True

    def _parse_length(self) -> tuple[int, int] | None:
        value = 0
        for i, byte in enumerate(self._buf[:_MAX_VARINT]):
            value |= (byte & 0x7F) << (7 * i)
            if not byte & 0x80:
                return value, i + 1
        if len(self._buf) >= _MAX_VARINT:
            raise FrameError("frame length prefix is not a valid varint")
        return None

    async def read_frame(self, limit: int) -> bytes | None:
        """The next frame, or ``None`` when the stream ended cleanly between frames.

        Raises :class:`FrameTooLarge` (nothing of the body is read),
        :class:`FrameError` for a malformed prefix and :class:`StreamBroken`
        when the stream ends inside a frame.
        """
        while (parsed := self._parse_length()) is None:
            if not await self._fill():
                if self._buf:
                    raise StreamBroken("stream ended inside a frame length prefix")
                return None
        length, header = parsed
        if length > limit:
            raise FrameTooLarge(length, limit)
        end = header + length
        while len(self._buf) < end:
            if not await self._fill():
                raise StreamBroken(f"stream ended after {len(self._buf) - header} of {length} frame bytes")
        frame = bytes(self._buf[header:end])
        del self._buf[:end]
        return frame


async def finish_stream(stream: Any, ok: bool) -> None:
    """Close (or, after an error, reset) a stream; never raises, never hangs.

    Both sides must do this: a stream that one side leaves half open leaks,
    and later streams to that peer stall (field notes).
    """
    with trio.CancelScope(shield=True, deadline=trio.current_time() + 2.0):
        try:
            if ok:
                await stream.close()
            else:
                await stream.reset()
        except Exception:
            pass
