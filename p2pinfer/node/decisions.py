"""What the dashboard shows of a node's routing: recent decisions and prefix groups.

:class:`DecisionLog` is a bounded ring of the requests that entered at this
node (entry, target, reason, predicted vs realised reused tokens, TTFT),
numbered so that a reader can ask for what is new since the last number.
:class:`PrefixGroups` sorts those requests' prompts into groups by their
first blocks (a subject's five-shot header, a shared system prompt) and
remembers how many each peer served; :meth:`PrefixGroups.holdings` reads,
from the peers' digests and this node's own cache, how many tokens of each
group every peer holds now: the swarm's specialisation, as this node sees it.

Plain bookkeeping with no I/O; the node feeds it from ``serving.py`` and
``p2pinfer/api/dashboard.py`` reads it.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
import re
import time
from typing import Any

__all__ = ["DecisionLog", "PrefixGroup", "PrefixGroups", "GROUP_BLOCKS"]

GROUP_BLOCKS = 4
"""Prompts whose first this-many blocks agree (64 tokens at 16 per block) share a group."""
MAX_GROUP_BLOCKS = 256
"""A group's shared prefix is followed for at most this many blocks."""

_SPECIAL = re.compile(r"<\|[^|>]{0,40}\|>|<s>|</s>")
_ROLES = {"system", "user", "assistant"}


def prompt_label(text: str, limit: int = 90) -> str:
    """The first line of a prompt that says something (chat markers and role names skipped)."""
    for line in _SPECIAL.sub("\n", text).splitlines():
        line = " ".join(line.split())
        if line and line.lower() not in _ROLES:
            return line if len(line) <= limit else line[: limit - 1] + "…"
    return "(empty prompt)"


@dataclass
class PrefixGroup:
    key: str
    label: str
    tokens: list[int]
    """The prefix that every prompt of the group seen so far shares (whole blocks)."""
    hashes: list[int]
    requests: int = 0
    served: dict[str, int] = field(default_factory=dict)
    """Peer -> requests of this group it served (entering here)."""
    hits: dict[str, int] = field(default_factory=dict)
    """Peer -> requests of this group it served from its cache (reused tokens > 0)."""
    reused_tokens: int = 0
    last_used: float = 0.0


class PrefixGroups:
    """At most ``capacity`` groups, the least recently used forgotten first."""

    def __init__(self, block_size: int, capacity: int = 48) -> None:
        self.block_size = block_size
        self.capacity = capacity
        self._groups: OrderedDict[str, PrefixGroup] = OrderedDict()

    def __len__(self) -> int:
        return len(self._groups)

    def key_of(self, hashes: Sequence[int]) -> str | None:
        if not hashes:
            return None
        return f"{hashes[min(GROUP_BLOCKS, len(hashes)) - 1] & 0xFFFFFFFFFFFF:012x}"

    def note(self, tokens: Sequence[int], hashes: Sequence[int], served_by: str, reused: int,
             label: Callable[[Sequence[int]], str], now: float) -> PrefixGroup | None:
        """One finished request; ``label(tokens)`` names a new group. None for a prompt under one block."""
        key = self.key_of(hashes)
        if key is None:
            return None
        group = self._groups.get(key)
        if group is None:
            depth = min(len(hashes), MAX_GROUP_BLOCKS)
            shared = list(tokens[: depth * self.block_size])
            head = shared[: GROUP_BLOCKS * self.block_size]
            group = PrefixGroup(key, label(head), shared, list(hashes[:depth]))
            self._groups[key] = group
            while len(self._groups) > self.capacity:
                self._groups.popitem(last=False)
        else:
            common = 0
            for a, b in zip(group.hashes, hashes):
                if a != b:
                    break
                common += 1
            if common < len(group.hashes):
                del group.hashes[common:]
                del group.tokens[common * self.block_size:]
            self._groups.move_to_end(key)
        group.requests += 1
        group.served[served_by] = group.served.get(served_by, 0) + 1
        if reused > 0:
            group.hits[served_by] = group.hits.get(served_by, 0) + 1
        group.reused_tokens += max(0, reused)
        group.last_used = now
        return group

    def groups(self) -> list[PrefixGroup]:
        return sorted(self._groups.values(), key=lambda g: (-g.requests, g.key))

    def holdings(self, longest_matches: Callable[[Sequence[int]], dict[str, int]], self_id: str,
                 local_match: Callable[[Sequence[int]], int], limit: int = 24) -> list[dict[str, Any]]:
        """The top ``limit`` groups by requests, each with the tokens of it that every peer holds now.

        ``longest_matches(hashes)`` is the peer view's (peer -> matched blocks);
        ``local_match(tokens)`` is this node's cache (matched tokens).
        """
        out = []
        for g in self.groups()[:limit]:
            held = {peer: blocks * self.block_size for peer, blocks in longest_matches(g.hashes).items()}
            mine = local_match(g.tokens)
            if mine:
                held[self_id] = mine
            out.append({
                "key": g.key,
                "label": g.label,
                "prefix_tokens": len(g.tokens),
                "requests": g.requests,
                "served": dict(g.served),
                "hits": dict(g.hits),
                "reused_tokens": g.reused_tokens,
                "held_tokens": held,
            })
        return out


class DecisionLog:
    """The last ``capacity`` requests that entered here, each numbered (``seq``) from 1."""

    def __init__(self, capacity: int = 512) -> None:
        if capacity < 1:
            raise ValueError("a decision log needs room for one entry")
        self._entries: deque[dict[str, Any]] = deque(maxlen=capacity)
        self.seq = 0
        self._listeners: list[Callable[[], None]] = []

    def __len__(self) -> int:
        return len(self._entries)

    def subscribe(self, listener: Callable[[], None]) -> None:
        """``listener()`` runs after every append (the dashboard wakes its streams)."""
        self._listeners.append(listener)

    def unsubscribe(self, listener: Callable[[], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def append(self, entry: dict[str, Any]) -> dict[str, Any]:
        self.seq += 1
        entry = {"seq": self.seq, "time": round(time.time(), 3), **entry}
        self._entries.append(entry)
        for listener in list(self._listeners):
            listener()
        return entry

    def since(self, seq: int, limit: int | None = None) -> list[dict[str, Any]]:
        """Entries numbered above ``seq``, oldest first (at most the last ``limit``)."""
        new = [e for e in self._entries if e["seq"] > seq] if seq < self.seq else []
        return new[-limit:] if limit is not None else new

    def recent(self, window_s: float, now: float | None = None) -> Iterable[dict[str, Any]]:
        """Entries of the last ``window_s`` seconds (wall clock)."""
        cutoff = (time.time() if now is None else now) - window_s
        return [e for e in self._entries if e["time"] >= cutoff]
