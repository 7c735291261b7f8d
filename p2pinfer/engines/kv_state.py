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

A model with an interleaved sliding-window cache (``llama_kv_cache_iswa``,
Gemma 2 and 3 for example) writes **two** such sections after the header:
its full-attention layers, then its sliding-window layers
(``llama_kv_cache_iswa::state_write``). The second holds only the cells
not masked for the sequence's last position, the last ``n_swa`` positions,
so a span can be cut from such a blob only while the sequence is no longer
than the window (every section then holds the same positions);
:func:`parse` raises :class:`KvWindowError` otherwise, and the runtime
caches only prompts that fit (``LlamaRuntime.cache_window``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
import struct
from typing import NamedTuple

import numpy as np

__all__ = ["KvFormatError", "KvLayout", "KvSpan", "KvWindowError", "MAX_SECTIONS", "encode", "parse"]

MAGIC = 0xAF143CD8
"""llama.cpp's ``io_magic`` at the head of every sequence state blob."""

MAX_SECTIONS = 4
"""KV cache sections one blob may hold (llama.cpp writes 1, or 2 for an iSWA cache)."""


class KvFormatError(ValueError):
    """A state blob is not in the format this module reads (another llama.cpp?)."""


class KvWindowError(KvFormatError):
    """The blob's sections hold different positions: a sliding-window section
    kept only its last window, so no span of the whole sequence can be cut."""


@dataclass(frozen=True, slots=True)
class KvLayout:
    """What every blob of one context shares: types and row sizes per layer."""

    n_stream: int
    v_trans: bool
    k: tuple[tuple[int, int], ...]
    """Per layer (ggml type, bytes per cell)."""
    v: tuple[tuple[int, int, int], ...]
    """Per layer (ggml type, bytes per element or per row, embedding rows if transposed else 1)."""
    sections: tuple[int, ...] = ()
    """Layers per KV cache section, in blob order (``k`` and ``v`` list the
    layers of all sections one after the other); ``()`` means one section."""

    @property
    def layers_per_section(self) -> tuple[int, ...]:
        return self.sections or (len(self.k),)

    @property
    def bytes_per_token(self) -> int:
        return sum(r for _, r in self.k) + sum(el * rows for _, el, rows in self.v)

    def blob_size(self, cells: int) -> int:
        n_sections = len(self.layers_per_section)
        head = 8 + n_sections * (4 + 4 * self.n_stream + 8)
        per_layer = 12 * (len(self.k) + len(self.v))
        return head + per_layer + cells * (12 * n_sections + self.bytes_per_token)


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


class _Section(NamedTuple):
    """What one ``llama_kv_cache::state_write`` section holds of the sequence."""

    n_stream: int
    v_trans: bool
    start: int
    cells: int
    k_meta: list[tuple[int, int]]
    k: list[np.ndarray]
    v_meta: list[tuple[int, int, int]]
    v: list[np.ndarray]


def _section(buf: memoryview, off: int, cells_seen: list[tuple[int, int]]) -> tuple[_Section | None, int]:
    """The section at ``off`` (None if no stream holds cells) and the offset after it."""
    (n_stream,), off = _take(buf, off, "<I")
    if not 1 <= n_stream <= 1 << 16:
        raise KvFormatError(f"implausible stream count {n_stream}")
    found = None
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
        cells_seen.append((start, cells))
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
        found = _Section(n_stream, bool(v_trans), start, cells, k_meta, k, v_meta, v)
    return found, off


def parse(blob: bytes | bytearray | memoryview) -> KvSpan:
    """The one sequence a ``llama_state_seq_get_data`` blob holds, as a span.

    Its positions must be consecutive and in cell order (as a sequence that
    was evaluated from position ``start`` on always is), and every section
    must hold the same positions: a sliding-window section that has dropped
    older positions raises :class:`KvWindowError`. The arrays are views of
    ``blob``: slice them before keeping them for long.
    """
    buf = memoryview(blob).cast("B")
    (magic, _seq), off = _take(buf, 0, "<Ii")
    if magic != MAGIC:
        raise KvFormatError(f"not a sequence state blob (magic {magic:#x})")
    found: list[_Section | None] = []
    seen: list[tuple[int, int]] = []
    while True:
        if len(found) == MAX_SECTIONS:
            raise KvFormatError(f"{len(buf) - off} bytes left over after {MAX_SECTIONS} KV cache sections")
        section, off = _section(buf, off, seen)
        found.append(section)
        if off == len(buf):
            break
    sections = [s for s in found if s is not None]
    if len(sections) < len(found):
        if sections:
            raise KvWindowError(f"one KV cache section holds no cells of the sequence, another {seen}")
        raise KvFormatError("the blob holds no cells")
    held = [(s.start, s.cells) for s in sections]
    if len(set(held)) > 1:
        (a0, n0), (a1, n1) = held[0], next(h for h in held if h != held[0])
        raise KvWindowError(
            f"the KV cache sections hold different positions ({a0}..{a0 + n0 - 1} and {a1}..{a1 + n1 - 1}): "
            "a sliding-window cache keeps only its last window"
        )
    if len({(s.n_stream, s.v_trans) for s in sections}) > 1:
        raise KvFormatError("the KV cache sections differ in stream count or V layout")
    first = sections[0]
    layout = KvLayout(
        first.n_stream,
        first.v_trans,
        tuple(m for s in sections for m in s.k_meta),
        tuple(m for s in sections for m in s.v_meta),
        tuple(len(s.k_meta) for s in sections),
    )
    return KvSpan(layout, first.start, [a for s in sections for a in s.k], [a for s in sections for a in s.v])


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
        if (span.layout.v_trans, span.layout.k, span.layout.v, span.layout.layers_per_section) != (
            layout.v_trans, layout.k, layout.v, layout.layers_per_section
        ):
            raise KvFormatError("a span comes from a context with another KV layout")
        expected = end
    p0 = pieces[0][1]
    cells = expected - p0
    out = bytearray(layout.blob_size(cells))
    buf = memoryview(out)
    struct.pack_into("<Ii", buf, 0, MAGIC, 0)
    off = 8
    first = 0
    cell_meta = np.dtype([("pos", "<i4"), ("n", "<u4"), ("seq", "<i4")])
    for n_layer in layout.layers_per_section:
        struct.pack_into("<II", buf, off, layout.n_stream, cells)  # the cells go in the first stream
        off += 8
        meta = np.frombuffer(buf, dtype=cell_meta, count=cells, offset=off)
        meta["pos"] = np.arange(p0, p0 + cells, dtype="<i4")
        meta["n"] = 1
        meta["seq"] = 0
        off += meta.nbytes
        struct.pack_into("<II", buf, off, int(layout.v_trans), n_layer)
        off += 8
        for il in range(first, first + n_layer):
            k_type, row = layout.k[il]
            struct.pack_into("<iQ", buf, off, k_type, row)
            off += 12
            dest = np.frombuffer(buf, np.uint8, cells * row, off).reshape(cells, row)
            for span, start, end in pieces:
                dest[start - p0 : end - p0] = span.k[il][start - span.start : end - span.start]
            off += cells * row
        for il in range(first, first + n_layer):
            v_type, el, rows = layout.v[il]
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
        off += 4 * (layout.n_stream - 1)  # the other streams: cell count 0 (already zero)
        first += n_layer
    assert off == len(out)
    return out
