"""Peers this node no longer trusts, and gossipsub peer scoring to match.

The routing core (:meth:`~p2pinfer.core.router.Router.on_forward_result`)
decides *that* a peer overclaims its cache; this module makes the verdict
stick at the network edge for ``distrust_s``:

* it outlives the peer's entry in the view (which a peer can reset by
  falling silent for ``peer_ttl_s`` or reconnecting): the gossip validator
  drops a sanctioned peer's digests and load reports, and it is not pulled,
  so it cannot re-enter the view with a fresh trust of 1.0;
* gossipsub's own peer score (py-libp2p 0.8.1 ``ScoreParams``) gets a
  behaviour penalty (P5) large enough to stay under the publish threshold
  for ``distrust_s``: gossipsub then drops what the peer forwards before
  any signature check or validation, stops sending it our messages (so it
  cannot copy our new prefixes) and stops relaying for it.

Gossip that is invalid beyond doubt and comes straight from its author
(malformed, spoofed, oversized: the forwarder is the signer) costs the
author one penalty point, so a peer that floods garbage is cut off at the
gossipsub layer after :data:`PUBLISH_THRESHOLD` such messages. P4 (invalid
messages) stays off: py-libp2p validators cannot say "ignore" instead of
"reject", so P4 would also charge honest relays for messages that are only
invalid to us (a per-origin rate limit, a newer wire version).
"""

from __future__ import annotations

import logging
import time
from typing import Any

__all__ = [
    "DECAY_PER_S",
    "PUBLISH_THRESHOLD",
    "PeerSanctions",
    "gossip_score_params",
]

log = logging.getLogger(__name__)

PUBLISH_THRESHOLD = 10.0
"""Behaviour penalty above which gossipsub ignores a peer (score below -10)."""
DECAY_PER_S = 0.99
"""Penalties decay by 1 % per second (gossipsub decays them once per heartbeat:
by ``DECAY_PER_S ** heartbeat_s``)."""
_MAX_REMEMBERED = 4096


def gossip_score_params(heartbeat_s: float = 1.0) -> Any:
    """py-libp2p ScoreParams: only the behaviour penalty (P5) counts.

    Topic scores (P1-P3) stay at 0 so that honest peers always score 0;
    thresholds are negative so that only a penalised peer falls below them.
    ``heartbeat_s`` is gossipsub's heartbeat, so that a penalty decays at
    :data:`DECAY_PER_S` per second whatever the heartbeat.
    """
    from libp2p.pubsub.score import ScoreParams

    return ScoreParams(
        p5_behavior_penalty_weight=1.0,
        p5_behavior_penalty_decay=DECAY_PER_S**heartbeat_s,
        p5_behavior_penalty_threshold=0.0,
        publish_threshold=-PUBLISH_THRESHOLD,
        gossip_threshold=-PUBLISH_THRESHOLD,
        graylist_threshold=-2 * PUBLISH_THRESHOLD,
        accept_px_threshold=-PUBLISH_THRESHOLD,
    )


def penalty_lasting(seconds: float) -> float:
    """The P5 penalty that stays above the publish threshold for ``seconds``."""
    return PUBLISH_THRESHOLD * DECAY_PER_S ** (-max(0.0, seconds)) + 0.01


class PeerSanctions:
    """Who is distrusted until when (monotonic clock), and the gossipsub side of it."""

    def __init__(self, scorer: Any | None, distrust_s: float) -> None:
        self._scorer = scorer
        self.distrust_s = distrust_s
        self._until: dict[str, float] = {}
        self.events = 0
        """Sanctions imposed so far (one per verdict)."""

    def distrust(self, peer_id: str, reason: str, now: float | None = None) -> None:
        """The router stopped trusting ``peer_id``: enforce it for ``distrust_s``."""
        now = time.monotonic() if now is None else now
        self._until[peer_id] = now + self.distrust_s
        self.events += 1
        self._penalize(peer_id, penalty_lasting(self.distrust_s))
        log.warning("peer %s distrusted for %.0f s: %s", peer_id, self.distrust_s, reason)
        if len(self._until) > _MAX_REMEMBERED:
            self.expire(now)
            while len(self._until) > _MAX_REMEMBERED:  # a flood of identities: forget the oldest
                del self._until[min(self._until, key=self._until.__getitem__)]

    def is_distrusted(self, peer_id: str, now: float | None = None) -> bool:
        until = self._until.get(peer_id)
        if until is None:
            return False
        if (time.monotonic() if now is None else now) >= until:
            del self._until[peer_id]
            self._lift(peer_id)
            return False
        return True

    def reapply(self, peer_id: str, now: float | None = None) -> bool:
        """After a reconnect (gossipsub forgets a peer's score when it disconnects)."""
        now = time.monotonic() if now is None else now
        if not self.is_distrusted(peer_id, now):
            return False
        self._penalize(peer_id, penalty_lasting(self._until[peer_id] - now))
        return True

    def enforce(self, now: float | None = None) -> int:
        """Top every sanctioned peer's gossipsub penalty back up to what is left of its sanction.

        gossipsub drops a peer's score when it disconnects; a reconnect can
        be quicker than our connection watcher notices, so this runs on a
        timer too. Returns how many penalties were topped up.
        """
        now = time.monotonic() if now is None else now
        self.expire(now)
        if self._scorer is None:
            return 0
        from libp2p.peer.id import ID

        fixed = 0
        for peer_id, until in list(self._until.items()):
            want = penalty_lasting(until - now)
            try:
                have = self._scorer.behavior_penalty.get(ID.from_base58(peer_id), 0.0)
            except Exception:
                continue
            if have < want * 0.98:
                self._penalize(peer_id, want - have)
                fixed += 1
        return fixed

    async def run(self, interval_s: float = 1.0) -> None:
        """Keep :meth:`enforce` going (a task in the node's nursery)."""
        import trio

        while True:
            await trio.sleep(interval_s)
            self.enforce()

    def invalid_gossip(self, peer_id: str) -> None:
        """One message from ``peer_id`` itself that no honest node would send."""
        self._penalize(peer_id, 1.0)

    def _penalize(self, peer_id: str, amount: float) -> None:
        if self._scorer is None:
            return
        try:
            from libp2p.peer.id import ID

            self._scorer.penalize_behavior(ID.from_base58(peer_id), amount)
        except Exception as exc:  # a scorer problem must not break routing
            log.debug("gossipsub penalty for %s failed: %s", peer_id, exc)

    def expire(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        for peer_id in [p for p, until in self._until.items() if until <= now]:
            del self._until[peer_id]
            self._lift(peer_id)

    def _lift(self, peer_id: str) -> None:
        """The sanction is over: bring its gossipsub penalty under the publish threshold now.

        gossipsub decays a penalty once per heartbeat, and heartbeats run
        late on a loaded machine, so left alone the penalty would outlast
        ``distrust_s`` (by 20 s and more at load 10). What is left just under
        the threshold still decays as usual, so a peer that goes on sending
        garbage is cut off again after a message or two.
        """
        if self._scorer is None:
            return
        try:
            from libp2p.peer.id import ID

            pid = ID.from_base58(peer_id)
            ceiling = PUBLISH_THRESHOLD - 0.5
            if self._scorer.behavior_penalty.get(pid, 0.0) > ceiling:
                self._scorer.behavior_penalty[pid] = ceiling
        except Exception as exc:  # a scorer problem must not break routing
            log.debug("lifting the gossipsub penalty of %s failed: %s", peer_id, exc)

    def remaining(self, now: float | None = None) -> dict[str, float]:
        """Distrusted peers -> seconds left (for /status)."""
        now = time.monotonic() if now is None else now
        self.expire(now)
        return {p: round(until - now, 1) for p, until in self._until.items()}
