"""TEST ONLY: a router that lies about its cache (``NodeProcess(..., lying=True)``).

A lying node advertises, as its own, every block hash its peers advertise:
it claims every prefix the swarm holds, to attract traffic it then serves
cold. It exists so that tests and ``p2pinfer bench liar`` can run a real
lying node process against honest ones and show the defence (trust in
:meth:`~p2pinfer.core.router.Router.on_forward_result`, then
:class:`~p2pinfer.net.sanctions.PeerSanctions`). The lab's scripted node
passes it to ``Node(router_factory=LyingRouter)``; nothing in the product
selects it. Everything else about the node is honest: it serves what it is
sent and reports its real reuse.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..core.digest import Digest, DigestTracker
from ..core.peers import ApplyResult
from ..core.router import Router

__all__ = ["LyingRouter", "claim"]


def claim(tracker: DigestTracker, hashes: Iterable[int]) -> int:
    """Add ``hashes`` to the advertised set as if the cache had inserted them.

    Reaches into the tracker's bookkeeping on purpose: no honest code path
    may advertise a hash the node neither caches nor is serving. Returns how
    many were new.
    """
    new = 0
    for h in hashes:
        if h in tracker._held:
            continue
        tracker._list(h)
        new += 1
    return new


class LyingRouter(Router):
    """A :class:`Router` whose digest also lists whatever its peers cache."""

    claimed = 0
    _lie: set[int] | None = None
    """Every hash ever claimed: the lie outlives our view of the peers."""

    def on_digest(self, digest: Digest, now: float) -> ApplyResult:
        result = super().on_digest(digest, now)
        state = self.view.get(digest.node_id)
        if state is not None and state.hashes:
            if self._lie is None:
                self._lie = set()
            self._lie |= state.hashes
            self.claimed += claim(self.tracker, state.hashes)
        return result

    # A claimed prefix that our small cache took in and evicted again is
    # claimed again before every digest we publish, even once the honest
    # nodes have stopped gossiping to us.
    def take_delta(self) -> bytes | None:
        if self._lie:
            self.claimed += claim(self.tracker, self._lie)
        return super().take_delta()

    def full_digest(self) -> bytes:
        if self._lie:
            self.claimed += claim(self.tracker, self._lie)
        return super().full_digest()
