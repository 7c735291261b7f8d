"""The sequence-state codec on synthetic blobs (no model needed): cutting spans and
writing several of them as one blob keeps every cell's bytes where they belong.
The real format is checked against llama.cpp itself in test_llama_runtime.py."""

from __future__ import annotations

import struct

from hypothesis import given, settings, strategies as st
import numpy as np
import pytest

from p2pinfer.engines.kv_state import MAGIC, KvFormatError, KvLayout, KvWindowError, encode, parse


def _blob(start: int, cells: int, *, n_stream: int, stream: int, v_trans: bool, layers: int = 3,
          k_row: int = 8, v_el: int = 2, v_rows: int = 4) -> bytes:
    """A blob as llama.cpp writes it; every byte says which cell and layer it belongs to."""
    return struct.pack("<Ii", MAGIC, stream) + _section(start, cells, n_stream=n_stream, stream=stream, v_trans=v_trans,
                                                     layers=layers, k_row=k_row, v_el=v_el, v_rows=v_rows)


def _section(start: int, cells: int, *, n_stream: int, stream: int, v_trans: bool, layers: int = 3,
             k_row: int = 8, v_el: int = 2, v_rows: int = 4, salt: int = 0) -> bytes:
    """One llama_kv_cache::state_write section."""
    out = bytearray(struct.pack("<I", n_stream))
    for s in range(n_stream):
        if s != stream:
            out += struct.pack("<I", 0)
            continue
        out += struct.pack("<I", cells)
        for c in range(cells):
            out += struct.pack("<iIi", start + c, 1, stream)
        out += struct.pack("<II", int(v_trans), layers)
        for il in range(layers):
            out += struct.pack("<iQ", 1, k_row)
            out += bytes(((start + c) * 7 + il + salt) % 251 for c in range(cells) for _ in range(k_row))
        for il in range(layers):
            if v_trans:
                out += struct.pack("<iII", 1, v_el, v_rows)
                out += bytes(((start + c) * 3 + il + 50 * j) % 251 for j in range(v_rows) for c in range(cells) for _ in range(v_el))
            else:
                out += struct.pack("<iQ", 1, v_el * v_rows)
                out += bytes(((start + c) * 3 + il) % 251 for c in range(cells) for _ in range(v_el * v_rows))
    return bytes(out)


@settings(max_examples=60, deadline=None)
@given(
    cuts=st.lists(st.integers(1, 39), min_size=0, max_size=4, unique=True),
    v_trans=st.booleans(),
    n_stream=st.integers(1, 4),
    data=st.data(),
)
def test_spans_cut_and_joined_are_the_whole(cuts: list[int], v_trans: bool, n_stream: int, data: st.DataObject) -> None:
    stream = data.draw(st.integers(0, n_stream - 1))
    whole_blob = _blob(0, 40, n_stream=n_stream, stream=stream, v_trans=v_trans)
    whole = parse(whole_blob)
    assert (whole.start, whole.end, whole.layout.n_stream) == (0, 40, n_stream)
    assert whole.nbytes == 40 * whole.layout.bytes_per_token
    bounds = [0, *sorted(cuts), 40]
    # each piece from a span of its own, saved with more positions than it keeps
    pieces = []
    for a, b in zip(bounds, bounds[1:]):
        lo, hi = max(0, a - 3), min(40, b + 2)
        pieces.append((whole.slice(lo, hi), a, b))
    joined = encode(pieces, whole.layout)
    assert len(joined) == whole.layout.blob_size(40) == len(whole_blob)
    back = parse(joined)
    assert all(np.array_equal(x, y) for x, y in zip(back.k + back.v, whole.k + whole.v))


def test_a_span_starting_later_keeps_its_positions() -> None:
    span = parse(_blob(100, 20, n_stream=2, stream=1, v_trans=True))
    assert (span.start, span.end) == (100, 120)
    part = span.slice(105, 110)
    assert (part.start, part.cells) == (105, 5)
    assert np.array_equal(part.k[1], span.k[1][5:10])
    with pytest.raises(ValueError):
        span.slice(90, 110)
    with pytest.raises(ValueError):
        encode([(span, 100, 110), (span, 111, 120)], span.layout)  # not consecutive


@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b[:-1],
        lambda b: b + b"\x00",
        lambda b: b"\x00\x00\x00\x00" + b[4:],  # magic
        lambda b: b[:16] + struct.pack("<iIi", 5, 1, 0) + b[28:],  # positions not consecutive
        lambda b: b[:20] + struct.pack("<I", 2) + b[24:],  # a cell in two sequences
    ],
)
def test_a_blob_in_another_format_is_refused(damage: object) -> None:
    blob = _blob(0, 6, n_stream=1, stream=0, v_trans=False)
    parse(blob)
    with pytest.raises(KvFormatError):
        parse(damage(blob))  # type: ignore[operator]


def test_spans_of_another_layout_are_not_mixed() -> None:
    a = parse(_blob(0, 4, n_stream=1, stream=0, v_trans=False))
    b = parse(_blob(4, 4, n_stream=1, stream=0, v_trans=False, k_row=16))
    with pytest.raises(KvFormatError):
        encode([(a, 0, 4), (b, 4, 8)], a.layout)
    assert isinstance(a.layout, KvLayout)


def _iswa_blob(start: int, cells: int, swa_start: int, *, n_stream: int = 2, stream: int = 0) -> bytes:
    """An interleaved sliding-window cache's blob (llama_kv_cache_iswa::state_write):
    the full-attention section (2 layers), then the sliding-window one (5 layers,
    other row sizes), which holds positions from ``swa_start`` on only."""
    base = _section(start, cells, n_stream=n_stream, stream=stream, v_trans=True, layers=2)
    swa = _section(swa_start, start + cells - swa_start, n_stream=n_stream, stream=stream, v_trans=True, layers=5,
                   k_row=4, v_rows=3, salt=100)
    return struct.pack("<Ii", MAGIC, stream) + base + swa


def test_a_sliding_window_blob_is_two_sections_cut_and_joined_together() -> None:
    blob = _iswa_blob(0, 30, 0, stream=1)
    whole = parse(blob)
    assert whole.layout.layers_per_section == (2, 5) and len(whole.k) == len(whole.v) == 7
    assert (whole.start, whole.end) == (0, 30)
    assert whole.nbytes == 30 * whole.layout.bytes_per_token
    assert [a.shape for a in whole.k] == [(30, 8)] * 2 + [(30, 4)] * 5
    # each section's bytes are its own: the sliding-window layers carry the salt
    assert whole.k[2][7, 0] == (7 * 7 + 0 + 100) % 251 and whole.k[1][7, 0] == (7 * 7 + 1) % 251
    joined = encode([(whole.slice(0, 12), 0, 12), (whole.slice(10, 30), 12, 30)], whole.layout)
    assert len(joined) == whole.layout.blob_size(30) == len(blob)
    back = parse(joined)
    assert back.layout == whole.layout
    assert all(np.array_equal(x, y) for x, y in zip(back.k + back.v, whole.k + whole.v))
    # ours names stream 0 where llama.cpp's named stream 1: otherwise the same bytes
    assert bytes(joined) == _iswa_blob(0, 30, 0, stream=0)


def test_a_sliding_window_section_that_dropped_positions_is_refused() -> None:
    with pytest.raises(KvWindowError, match=r"0\.\.39 and 8\.\.39"):
        parse(_iswa_blob(0, 40, 8))
    assert issubclass(KvWindowError, KvFormatError)
    one = parse(_blob(0, 6, n_stream=2, stream=0, v_trans=True))
    two = parse(_iswa_blob(0, 6, 0))
    with pytest.raises(KvFormatError):
        encode([(one, 0, 6)], two.layout)  # a one-section span is never written as two
    with pytest.raises(KvFormatError):
        parse(_iswa_blob(0, 6, 0)[:-3])
