"""Length-prefixed frames: limits checked before the body, short reads, EOF."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st
import pytest

from p2pinfer.net.framing import FrameError, FrameReader, FrameTooLarge, StreamBroken, encode_frame


class FakeStream:
    """Serves ``data`` in reads of at most ``step`` bytes, counting what was read."""

    def __init__(self, data: bytes, step: int = 7) -> None:
        self.data = data
        self.pos = 0
        self.step = step

    async def read(self, n: int | None = None) -> bytes:
        take = min(self.step, n or self.step)
        out = self.data[self.pos : self.pos + take]
        self.pos += len(out)
        return out


@given(st.lists(st.binary(max_size=300), max_size=8), st.integers(1, 64))
@settings(max_examples=60, deadline=None)
async def test_frames_round_trip_through_short_reads(frames, step):
    reader = FrameReader(FakeStream(b"".join(encode_frame(f) for f in frames), step))
    got = []
    while (frame := await reader.read_frame(1000)) is not None:
        got.append(frame)
    assert got == frames


async def test_oversized_frame_is_refused_before_its_body_is_read():
    body = b"x" * 100_000
    stream = FakeStream(encode_frame(body), step=16)
    with pytest.raises(FrameTooLarge) as info:
        await FrameReader(stream).read_frame(1000)
    assert info.value.size == 100_000 and info.value.limit == 1000
    assert stream.pos <= 16  # only the length prefix (one read) was consumed


async def test_absurd_length_prefix_costs_nothing():
    prefix = bytes([0xFF] * 9 + [0x01])  # 2**64 - 1
    with pytest.raises(FrameTooLarge):
        await FrameReader(FakeStream(prefix)).read_frame(1 << 20)


async def test_overlong_varint_is_malformed():
    with pytest.raises(FrameError, match="varint"):
        await FrameReader(FakeStream(b"\x80" * 12)).read_frame(1 << 20)


async def test_truncated_frame_is_a_broken_stream():
    with pytest.raises(StreamBroken, match="3 of 10"):
        await FrameReader(FakeStream(b"\x0aabc")).read_frame(100)
    with pytest.raises(StreamBroken, match="prefix"):
        await FrameReader(FakeStream(b"\x80")).read_frame(100)


async def test_clean_eof_between_frames_is_none():
    reader = FrameReader(FakeStream(encode_frame(b"one")))
    assert await reader.read_frame(10) == b"one"
    assert await reader.read_frame(10) is None
    assert await reader.read_frame(10) is None
