"""Radix tree over token ids: the shape of a node's prefix cache.

The engine owns one of these and keeps it equal to what its KV cache really
holds; the routing layer reads it (exact local match length) and follows its
insert/evict events to build the digest that peers see. It is pure: no clock,
no I/O. Recency is a logical counter so that runs are deterministic.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
import heapq
from typing import Literal

__all__ = ["PinHandle", "RadixTree", "TreeEvent"]


@dataclass(frozen=True, slots=True)
class TreeEvent:
    """A change to the set of cached token paths.

    ``path`` runs from the root to the end of the changed segment and
    ``start`` is where the change begins: ``path[start:]`` was added (insert)
    or removed (evict). An evicted segment is always the tail of a leaf, so
    after an evict nothing longer than ``start`` remains along ``path``.
    """

    kind: Literal["insert", "evict"]
    path: tuple[int, ...]
    start: int


@dataclass(frozen=True, slots=True)
class PinHandle:
    """Proof of a pin; give it back to :meth:`RadixTree.unpin` exactly once."""

    tokens: tuple[int, ...]


@dataclass(eq=False, slots=True)
class _Node:
    key: list[int]
    parent: _Node | None
    children: dict[int, _Node] = field(default_factory=dict)
    last_access: int = 0
    pins: int = 0
    hits: int = 0
    """Times a real cache hit (``match(touch=True)``) covered this node since it was inserted."""

    def depth_tokens(self) -> tuple[int, ...]:
        parts: list[list[int]] = []
        node: _Node | None = self
        while node is not None:
            parts.append(node.key)
            node = node.parent
        out: list[int] = []
        for part in reversed(parts):
            out.extend(part)
        return tuple(out)


Listener = Callable[[TreeEvent], None]


class RadixTree:
    """Token-level radix tree with LRU eviction to a budget and pinning.

    ``capacity_tokens`` (optional) is enforced after every insert by evicting
    least-recently-used unpinned leaves; pinned paths may push the total over
    the budget, which is reported by :attr:`total_tokens`, never hidden.
    """

    def __init__(self, capacity_tokens: int | None = None) -> None:
        if capacity_tokens is not None and capacity_tokens < 0:
            raise ValueError("capacity_tokens must be >= 0")
        self.capacity_tokens = capacity_tokens
        self._root = _Node(key=[], parent=None)
        self._clock = 0
        self._total = 0
        self._listeners: list[Listener] = []

    # -- observation -------------------------------------------------------
    @property
    def total_tokens(self) -> int:
        """Tokens stored (shared prefixes counted once)."""
        return self._total

    def subscribe(self, listener: Listener) -> None:
        """Call ``listener`` with every future :class:`TreeEvent`."""
        self._listeners.append(listener)

    def unsubscribe(self, listener: Listener) -> None:
        self._listeners.remove(listener)

    def _emit(self, event: TreeEvent) -> None:
        for listener in list(self._listeners):
            listener(event)

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def sequences(self) -> Iterator[tuple[int, ...]]:
        """Every maximal cached path (one per leaf)."""
        stack = [self._root]
        while stack:
            node = stack.pop()
            if not node.children and node is not self._root:
                yield node.depth_tokens()
            stack.extend(node.children.values())

    def __len__(self) -> int:
        return sum(1 for _ in self.sequences())

    # -- lookup --------------------------------------------------------------
    def _walk(self, tokens: Sequence[int]) -> tuple[int, list[_Node], int]:
        """Longest match; returns (length, nodes touched, tokens matched in last node)."""
        node = self._root
        matched = 0
        path: list[_Node] = []
        last_partial = 0
        n = len(tokens)
        while matched < n:
            child = node.children.get(tokens[matched])
            if child is None:
                break
            key = child.key
            k = 1
            limit = min(len(key), n - matched)
            while k < limit and key[k] == tokens[matched + k]:
                k += 1
            path.append(child)
            matched += k
            last_partial = k
            if k < len(key):
                break
            node = child
        return matched, path, last_partial

    def match(self, tokens: Sequence[int], *, touch: bool = True) -> int:
        """Length of the longest cached prefix of ``tokens``.

        ``touch`` marks the matched path as recently used (a real cache hit);
        routing probes pass ``touch=False`` so that looking does not change
        what gets evicted.
        """
        matched, path, partial = self._walk(tokens)
        if touch and path:
            now = self._tick()
            if partial < len(path[-1].key):
                # Only the matched part was used: split it off, so that the
                # rest (another prompt's tail) keeps its own place in the LRU
                # order instead of surviving with the shared prefix (issue 22).
                path[-1] = self._split(path[-1], partial)
            for node in path:
                node.last_access = now
                node.hits += 1
        return matched

    # -- mutation ------------------------------------------------------------
    def _split(self, node: _Node, at: int) -> _Node:
        """Split ``node`` so that its first ``at`` tokens become a new parent."""
        assert node.parent is not None and 0 < at < len(node.key)
        upper = _Node(
            key=node.key[:at],
            parent=node.parent,
            last_access=node.last_access,
            pins=node.pins,
            hits=node.hits,
        )
        node.parent.children[upper.key[0]] = upper
        node.key = node.key[at:]
        node.parent = upper
        upper.children[node.key[0]] = node
        return upper

    def insert(self, tokens: Sequence[int]) -> int:
        """Cache ``tokens`` (and so every prefix of it); returns tokens added.

        Evicts to the capacity afterwards; the inserted path itself is the
        most recently used and is evicted last.
        """
        now = self._tick()
        node = self._root
        i = 0
        n = len(tokens)
        while i < n:
            child = node.children.get(tokens[i])
            if child is None:
                break
            key = child.key
            k = 1
            limit = min(len(key), n - i)
            while k < limit and key[k] == tokens[i + k]:
                k += 1
            if k < len(key):
                child = self._split(child, k)
            child.last_access = now
            node = child
            i += k
        added = n - i
        if added:
            leaf = _Node(key=list(tokens[i:]), parent=node, last_access=now)
            node.children[leaf.key[0]] = leaf
            self._total += added
            self._emit(TreeEvent("insert", tuple(tokens), i))
        if self.capacity_tokens is not None and self._total > self.capacity_tokens:
            self.evict(self.capacity_tokens)
        return added

    def pin(self, tokens: Sequence[int]) -> PinHandle:
        """Protect the cached prefix of ``tokens`` from eviction.

        The pin covers whole nodes (up to the end of the node where the match
        ends) so that later splits keep both halves pinned.
        """
        matched, path, partial = self._walk(tokens)
        if not path:
            return PinHandle(())
        boundary = matched - partial + len(path[-1].key)
        for node in path:
            node.pins += 1
        full = path[-1].depth_tokens()
        assert len(full) == boundary
        return PinHandle(full)

    def unpin(self, handle: PinHandle) -> None:
        if not handle.tokens:
            return
        matched, path, partial = self._walk(handle.tokens)
        if matched != len(handle.tokens) or partial != len(path[-1].key):
            raise ValueError("pin handle does not match the tree (unpinned twice?)")
        for node in path:
            if node.pins <= 0:
                raise ValueError("unpin without a matching pin")
            node.pins -= 1

    def pinned_tokens(self) -> int:
        total = 0
        stack = list(self._root.children.values())
        while stack:
            node = stack.pop()
            if node.pins:
                total += len(node.key)
            stack.extend(node.children.values())
        return total

    def _remove_leaf(self, leaf: _Node) -> None:
        assert leaf.parent is not None and not leaf.children
        path = leaf.depth_tokens()
        start = len(path) - len(leaf.key)
        del leaf.parent.children[leaf.key[0]]
        self._total -= len(leaf.key)
        parent = leaf.parent
        leaf.parent = None
        self._emit(TreeEvent("evict", path, start))
        # Merge a parent left with a single child so the tree stays compact;
        # not a reused prefix with a never-reused tail, which would then take
        # the prefix's recency (see ``match``: issue 22).
        if parent is not self._root and len(parent.children) == 1 and parent.pins == 0:
            (only,) = parent.children.values()
            if only.pins == 0 and (only.hits > 0) == (parent.hits > 0):
                parent.key = parent.key + only.key
                parent.children = only.children
                for grandchild in parent.children.values():
                    grandchild.parent = parent
                parent.last_access = max(parent.last_access, only.last_access)
                only.parent = None  # marks any queued heap entry for it as stale

    def evict(self, target_tokens: int) -> int:
        """Evict least-recently-used unpinned leaves until at most ``target_tokens``
        remain (or nothing evictable is left). Returns tokens evicted."""
        if self._total <= target_tokens:
            return 0
        heap: list[tuple[int, int, _Node]] = []
        counter = 0
        stack = list(self._root.children.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif node.pins == 0:
                heap.append((node.last_access, counter, node))
                counter += 1
        heapq.heapify(heap)
        before = self._total
        while self._total > target_tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            if leaf.parent is None or leaf.children or leaf.pins:
                continue  # stale entry: merged or changed since queued
            parent = leaf.parent
            self._remove_leaf(leaf)
            if parent.parent is not None and not parent.children and parent.pins == 0:
                heapq.heappush(heap, (parent.last_access, counter, parent))
                counter += 1
        return before - self._total

    def remove(self, tokens: Sequence[int]) -> int:
        """Drop the part of ``tokens`` that no other cached sequence shares.

        For engines that free a whole stored sequence at once. Pinned nodes
        stay. Returns tokens removed.
        """
        matched, path, partial = self._walk(tokens)
        if not path or matched != len(tokens) or partial != len(path[-1].key):
            return 0
        removed = 0
        node = path[-1]
        while node.parent is not None and not node.children and node.pins == 0:
            parent = node.parent
            shared = len(parent.children) > 1  # the parent belongs to another sequence too
            removed += len(node.key)
            self._remove_leaf(node)
            if shared or parent is self._root:
                break
            node = parent
        return removed

    def clear(self) -> int:
        """Evict everything unpinned."""
        return self.evict(0)
