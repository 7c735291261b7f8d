"""What a one-at-a-time engine will have cached by the time a request starts.

Both built-in engines serve requests first come first served, one at a
time, and cache each prompt when it is done. A request queued behind
another with the same prefix will find that prefix cached when its turn
comes, so its queued prefill work is the part *neither* the cache *nor*
a prompt ahead of it covers. Counting the whole prompt instead made a
node with two same-subject requests queued report several times its real
backlog, and its peers then computed the prefix cold elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["PromptsAhead", "shared_prefix_len"]


def shared_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    if type(a) is not type(b):
        a, b = list(a), list(b)
    n = min(len(a), len(b))
    lo, hi = 0, n
    # Binary search on slice equality: C-speed comparisons, O(log n) of them.
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class PromptsAhead:
    """Prompts accepted and not finished, in arrival order."""

    def __init__(self) -> None:
        self._prompts: list[list[int]] = []

    def __len__(self) -> int:
        return len(self._prompts)

    def covered(self, tokens: Sequence[int]) -> int:
        """Leading tokens of ``tokens`` that some prompt ahead will have cached."""
        return max((shared_prefix_len(p, tokens) for p in self._prompts), default=0)

    def add(self, tokens: list[int]) -> None:
        self._prompts.append(tokens)

    def remove(self, tokens: list[int]) -> None:
        """Drop this very list (by identity: equal prompts may be queued twice)."""
        for i, p in enumerate(self._prompts):
            if p is tokens:
                del self._prompts[i]
                return
