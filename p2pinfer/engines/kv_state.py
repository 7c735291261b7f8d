"""The KV of consecutive positions of one sequence, in llama.cpp's own layout.

``llama_state_seq_get_data`` serialises one sequence's cells; ``_set_data``
puts a blob back into a sequence, **replacing** what it held. With one KV
stream per sequence (``kv_unified = false``, which batching needs, see
:mod:`~p2pinfer.engines.llama_runtime`) the old trick of loading several
saved spans one after the other through a scratch sequence no longer
works: a scratch sequence lives in another stream, and copying between
streams moves whole buffers. So the cache keeps spans in this module's
form (per layer, the K rows and V columns of the span's cells, as numpy
views of llama.cpp's bytes) and a cache hit writes *one* blob for the whole
restored prefix: the spans concatenated along the cell axis.

The blob format (``llama_kv_cache::state_write`` in llama.cpp, pinned by
llama-cpp-python 0.3.36; :func:`parse` checks every size and refuses
anything else)::

    u32 magic 0xaf143cd8, i32 seq_id       (llama_context::state_seq_get_data)
    u32 n_stream                           (llama_kv_cache::state_write from here)
    per stream: u32 cell_count
        cell_count x (i32 pos, u32 n_seq_id = 1, i32 seq_id)
        u32 v_trans, u32 n_layer
        per layer: i32 k_type, u64 k_row_bytes, cell_count x k_row_bytes
        v_trans = 0, per layer: i32 v_type, u64 v_row_bytes, cell_count x v_row_bytes
        v_trans = 1, per layer: i32 v_type, u32 v_el_bytes, u32 n_embd_v,
                                n_embd_v x cell_count x v_el_bytes

The stream count is the context's ``n_seq_max``; spans here do not carry
it, so they could even be restored into a context with another slot count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
import struct

import numpy as np

__all__ = ["KvFormatError", "KvLayout", "KvSpan", "encode", "parse"]

MAGIC = 0xAF143CD8
"""llama.cpp's ``io_magic`` at the head of every sequence state blob."""


class KvFormatError(ValueError):
    """A state blob is not in the format this module reads (another llama.cpp?)."""


@dataclass(frozen=True, slots=True)
class KvLayout:
    """What every blob of one context shares: types and row sizes per layer."""

    n_stream: int
    v_trans: bool
    k: tuple[tuple[int, int], ...]
    """Per layer (ggml type, bytes per cell)."""
    v: tuple[tuple[int, int, int], ...]
    """Per layer (ggml type, bytes per element or per row, embedding rows if transposed else 1)."""

    @property
    def bytes_per_token(self) -> int:
        return sum(r for _, r in self.k) + sum(el * rows for _, el, rows in self.v)

    def blob_size(self, cells: int) -> int:
        head = 8 + 4 + 4 * self.n_stream + 8
        per_layer = 12 * (len(self.k) + len(self.v))
        return head + per_layer + cells * (12 + self.bytes_per_token)


@dataclass(eq=False, slots=True)
class KvSpan:
    """KV of positions ``[start, start + cells)`` of one sequence."""

    layout: KvLayout
    start: int
    k: list[np.ndarray]
    """Per layer, ``(cells, k_row_bytes)`` uint8."""
    v: list[np.ndarray]
    """Per layer, ``(cells, v_row_bytes)``, or ``(n_embd_v, cells * v_el_bytes)`` when transposed."""

    @property
    def cells(self) -> int:
        return int(self.k[0].shape[0]) if self.k else 0

    @property
    def end(self) -> int:
        return self.start + self.cells

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.k) + sum(a.nbytes for a in self.v)

    def slice(self, start: int, end: int) -> KvSpan:
        """Positions ``[start, end)`` as a new span that owns its memory (a copy)."""
        if not self.start <= start <= end <= self.end:
            raise ValueError(f"positions {start}..{end} are not inside {self.start}..{self.end}")
        a, b = start - self.start, end - self.start
        k = [np.ascontiguousarray(x[a:b]) for x in self.k]
        if self.layout.v_trans:
            v = [np.ascontiguousarray(x[:, a * el : b * el]) for x, (_, el, _) in zip(self.v, self.layout.v)]
        else:
            v = [np.ascontiguousarray(x[a:b]) for x in self.v]
        return KvSpan(self.layout, start, k, v)


def _take(buf: memoryview, off: int, fmt: str) -> tuple[tuple[int, ...], int]:
    size = struct.calcsize(fmt)
    if off + size > len(buf):
        raise KvFormatError("the state blob ends early")
    return struct.unpack_from(fmt, buf, off), off + size


def _bytes(buf: memoryview, off: int, count: int) -> np.ndarray:
    if count < 0 or off + count > len(buf):
        raise KvFormatError("the state blob ends early")
    return np.frombuffer(buf, np.uint8, count, off)


def parse(blob: bytes | bytearray | memoryview) -> KvSpan:
    """The one sequence a ``llama_state_seq_get_data`` blob holds, as a span.

    Its positions must be consecutive and in cell order (as a sequence that
    was evaluated from position ``start`` on always is). The arrays are
    views of ``blob``: slice them before keeping them for long.
    """
    buf = memoryview(blob).cast("B")
    (magic, _seq, n_stream), off = _take(buf, 0, "<IiI")
    if magic != MAGIC:
        raise KvFormatError(f"not a sequence state blob (magic {magic:#x})")
    if not 1 <= n_stream <= 1 << 16:
        raise KvFormatError(f"implausible stream count {n_stream}")
    found: KvSpan | None = None
    for _ in range(n_stream):
        (cells,), off = _take(buf, off, "<I")
        if cells == 0:
            continue
        if found is not None:
            raise KvFormatError("the blob holds cells in more than one stream")
        meta = _bytes(buf, off, 12 * cells).view(np.dtype([("pos", "<i4"), ("n", "<u4"), ("seq", "<i4")]))
        off += meta.nbytes
        if not (meta["n"] == 1).all():
            raise KvFormatError("cells with several sequences or extra cell data are not supported")
        pos = meta["pos"]
        start = int(pos[0])
        if not np.array_equal(pos, np.arange(start, start + cells, dtype=pos.dtype)):
            raise KvFormatError("the sequence's positions are not consecutive in cell order")
        (v_trans, n_layer), off = _take(buf, off, "<II")
        if v_trans not in (0, 1):
            raise KvFormatError(f"v_trans is {v_trans}")
        k_meta: list[tuple[int, int]] = []
        k: list[np.ndarray] = []
        for _ in range(n_layer):
            (k_type, row), off = _take(buf, off, "<iQ")
            k_meta.append((k_type, row))
            k.append(_bytes(buf, off, cells * row).reshape(cells, row))
            off += cells * row
        v_meta: list[tuple[int, int, int]] = []
        v: list[np.ndarray] = []
        for _ in range(n_layer):
            if v_trans:
                (v_type, el, rows), off = _take(buf, off, "<iII")
                v_meta.append((v_type, el, rows))
                v.append(_bytes(buf, off, rows * cells * el).reshape(rows, cells * el))
                off += rows * cells * el
            else:
                (v_type, row), off = _take(buf, off, "<iQ")
                v_meta.append((v_type, row, 1))
                v.append(_bytes(buf, off, cells * row).reshape(cells, row))
                off += cells * row
        layout = KvLayout(n_stream, bool(v_trans), tuple(k_meta), tuple(v_meta))
        found = KvSpan(layout, start, k, v)
    if off != len(buf):
        raise KvFormatError(f"{len(buf) - off} bytes left over after the last stream")
    if found is None:
        raise KvFormatError("the blob holds no cells")
    return found


def encode(pieces: Sequence[tuple[KvSpan, int, int]], layout: KvLayout) -> bytearray:
    """One blob for ``llama_state_seq_set_data`` holding positions ``[p0, pn)``.

    ``pieces`` are ``(span, start, end)`` with consecutive ranges; each
    span's positions ``[start, end)`` are copied once, straight into the
    blob. All spans must come from contexts with this ``layout`` (types and
    row sizes); the stream count is ``layout``'s.
    """
    if not pieces:
        raise ValueError("nothing to encode")
    expected = pieces[0][1]
    for span, start, end in pieces:
        if start != expected or not span.start <= start < end <= span.end:
            raise ValueError(f"piece {start}..{end} does not continue at {expected} inside its span")
        if (span.layout.v_trans, span.layout.k, span.layout.v) != (layout.v_trans, layout.k, layout.v):
            raise KvFormatError("a span comes from a context with another KV layout")
        expected = end
    p0 = pieces[0][1]
    cells = expected - p0
    out = bytearray(layout.blob_size(cells))
    buf = memoryview(out)
    struct.pack_into("<IiII", buf, 0, MAGIC, 0, layout.n_stream, cells)  # the cells go in the first stream
    off = 16
    meta = np.frombuffer(buf, dtype=np.dtype([("pos", "<i4"), ("n", "<u4"), ("seq", "<i4")]), count=cells, offset=off)
    meta["pos"] = np.arange(p0, p0 + cells, dtype="<i4")
    meta["n"] = 1
    meta["seq"] = 0
    off += meta.nbytes
    struct.pack_into("<II", buf, off, int(layout.v_trans), len(layout.k))
    off += 8
    for il, (k_type, row) in enumerate(layout.k):
        struct.pack_into("<iQ", buf, off, k_type, row)
        off += 12
        dest = np.frombuffer(buf, np.uint8, cells * row, off).reshape(cells, row)
        for span, start, end in pieces:
            dest[start - p0 : end - p0] = span.k[il][start - span.start : end - span.start]
        off += cells * row
    for il, (v_type, el, rows) in enumerate(layout.v):
        if layout.v_trans:
            struct.pack_into("<iII", buf, off, v_type, el, rows)
            off += 12
            dest = np.frombuffer(buf, np.uint8, rows * cells * el, off).reshape(rows, cells * el)
            for span, start, end in pieces:
                a, b = start - span.start, end - span.start
                dest[:, (start - p0) * el : (end - p0) * el] = span.v[il][:, a * el : b * el]
            off += rows * cells * el
        else:
            struct.pack_into("<iQ", buf, off, v_type, el)
            off += 12
            dest = np.frombuffer(buf, np.uint8, cells * el, off).reshape(cells, el)
            for span, start, end in pieces:
                dest[start - p0 : end - p0] = span.v[il][start - span.start : end - span.start]
            off += cells * el
    assert off + 4 * (layout.n_stream - 1) == len(out)  # the other streams: cell count 0 (already zero)
    return out
