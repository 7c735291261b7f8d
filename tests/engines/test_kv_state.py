"""The sequence-state codec on synthetic blobs (no model needed): cutting spans and
writing several of them as one blob keeps every cell's bytes where they belong.
The real format is checked against llama.cpp itself in test_llama_runtime.py."""

from __future__ import annotations

import struct

from hypothesis import given, settings, strategies as st
import numpy as np
import pytest

from p2pinfer.engines.kv_state import MAGIC, KvFormatError, KvLayout, encode, parse


def _blob(start: int, cells: int, *, n_stream: int, stream: int, v_trans: bool, layers: int = 3,
          k_row: int = 8, v_el: int = 2, v_rows: int = 4) -> bytes:
    """A blob as llama.cpp writes it; every byte says which cell and layer it belongs to."""
    out = bytearray(struct.pack("<IiI", MAGIC, stream, n_stream))
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
            out += bytes(((start + c) * 7 + il) % 251 for c in range(cells) for _ in range(k_row))
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
