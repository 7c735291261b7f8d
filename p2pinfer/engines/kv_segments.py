"""Where each cached token's KV lives: saved spans that tile the radix tree.

The llama.cpp engine keeps its prefix cache outside the context, as spans of
KV state saved with ``llama_state_seq_get_data``. A span is created for
exactly the tokens an insert adds to the engine's
:class:`~p2pinfer.core.radix.RadixTree` (``path[start:]``) and shrinks or
goes away with exactly the tokens an evict removes, so the tree's token
count *is* the number of tokens held, and a prefix shared by many prompts
is stored once. The store is driven by the tree's events and does no I/O:
re-saving a shrunk span is left to the engine (:meth:`SegmentStore.stale`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from ..core.radix import RadixTree, TreeEvent

__all__ = ["Segment", "SegmentStore"]

B = TypeVar("B")


@dataclass(eq=False, slots=True)
class Segment(Generic[B]):
    """Positions ``[start, end)`` of the path ``tokens`` (which ends at ``end``)."""

    tokens: tuple[int, ...]
    start: int
    blob: B | None
    """Saved KV covering positions ``[blob_start, blob_end)``; ``None`` when
    the tree holds tokens we have no KV for (see :meth:`SegmentStore.phantoms`)."""
    blob_start: int
    blob_end: int

    @property
    def end(self) -> int:
        return len(self.tokens)

    @property
    def stale(self) -> bool:
        """The blob holds more positions than the segment (an evict cut it)."""
        return self.blob is not None and (self.blob_start != self.start or self.blob_end != self.end)


class SegmentStore(Generic[B]):
    """Segments keyed by ``path[:start + 1]``, kept equal to the tree by its events.

    Only :meth:`insert` should add to the tree: it hands the payload for the
    new tokens to the insert event. Anything inserted into the tree some
    other way has no payload; it becomes a *phantom* that is never restored
    and that the engine removes again.
    """

    def __init__(self, tree: RadixTree) -> None:
        self._tree = tree
        self._segments: dict[tuple[int, ...], Segment[B]] = {}
        self._pending: tuple[tuple[int, ...], int, B] | None = None
        tree.subscribe(self._on_event)

    # -- observation --------------------------------------------------------
    def __len__(self) -> int:
        return len(self._segments)

    def segments(self) -> list[Segment[B]]:
        return list(self._segments.values())

    def tokens_held(self) -> int:
        """Tokens with a segment; equals ``tree.total_tokens`` at all times."""
        return sum(s.end - s.start for s in self._segments.values())

    def stale(self) -> list[Segment[B]]:
        return [s for s in self._segments.values() if s.stale]

    def phantoms(self) -> list[Segment[B]]:
        return [s for s in self._segments.values() if s.blob is None]

    def is_live(self, seg: Segment[B]) -> bool:
        return self._segments.get(seg.tokens[: seg.start + 1]) is seg

    # -- the chain of segments along a token sequence --------------------------
    def chain(self, tokens: Sequence[int], limit: int) -> list[tuple[Segment[B], int]]:
        """Segments covering ``tokens[:limit]`` in order, each with where its use ends.

        Stops early where no segment continues the sequence (which only
        happens when the tree holds less than ``limit`` tokens of it).
        """
        out: list[tuple[Segment[B], int]] = []
        pos = 0
        limit = min(limit, len(tokens))
        while pos < limit:
            seg = self._segments.get(tuple(tokens[: pos + 1]))
            if seg is None:
                break
            end = min(seg.end, limit)
            if seg.tokens[pos + 1 : end] != tuple(tokens[pos + 1 : end]):
                d = pos + 1
                while seg.tokens[d] == tokens[d]:
                    d += 1
                end = d
            out.append((seg, end))
            pos = end
        return out

    def plan(self, tokens: Sequence[int], limit: int) -> list[tuple[Segment[B], int]]:
        """Like :meth:`chain`, cut before the first segment without a payload."""
        out = []
        for seg, end in self.chain(tokens, limit):
            if seg.blob is None:
                break
            out.append((seg, end))
        return out

    # -- mutation ---------------------------------------------------------------
    def insert(self, tokens: Sequence[int], start: int, blob: B) -> int:
        """Insert ``tokens`` into the tree; ``blob`` holds positions ``[start, len)``.

        Returns what the tree added. The blob may cover more than the tree
        adds (it is then marked stale); if the tree adds positions before
        ``start`` the new segment has no payload (a phantom).
        """
        path = tuple(tokens)
        self._pending = (path, start, blob)
        try:
            return self._tree.insert(path)
        finally:
            self._pending = None

    def replace_blob(self, seg: Segment[B], blob: B, blob_start: int, blob_end: int) -> bool:
        """Swap in a re-saved payload if it still covers the (live) segment."""
        if not self.is_live(seg) or blob_start > seg.start or blob_end < seg.end:
            return False
        seg.blob, seg.blob_start, seg.blob_end = blob, blob_start, blob_end
        return True

    def _on_event(self, event: TreeEvent) -> None:
        if event.kind == "insert":
            self._on_insert(event.path, event.start)
        else:
            self._on_evict(event.path, event.start)

    def _on_insert(self, path: tuple[int, ...], start: int) -> None:
        pending = self._pending
        blob: B | None = None
        blob_start = blob_end = start
        if pending is not None and pending[0] == path and pending[1] <= start:
            blob, blob_start, blob_end = pending[2], pending[1], len(path)
        self._segments[path[: start + 1]] = Segment(path, start, blob, blob_start, blob_end)

    def _on_evict(self, path: tuple[int, ...], start: int) -> None:
        # An evict removes path[start:] and nothing longer survives along
        # path, so every segment on it that reaches past start is cut there.
        for seg, used_to in self.chain(path, len(path)):
            if used_to <= start:
                continue  # ends before the cut, or leaves path before it
            if seg.start >= start:
                del self._segments[seg.tokens[: seg.start + 1]]
                seg.blob = None
            else:
                seg.tokens = seg.tokens[:start]
