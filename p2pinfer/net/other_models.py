"""Peers that run another model, tokenizer, chat template or block size.

Their caches are useless to us (their block hashes are seeded by another
:class:`~p2pinfer.core.blocks.ModelFingerprint`) and their answers would be
wrong, so they are kept out of the view: they gossip on another topic, their
digests are refused by the validators and by the pull client, and a peer
found out (a pull or a forward refused with MODEL_MISMATCH, a digest for
another fingerprint) is dropped from the view and never routed to.

The operator hears of each such peer once, with the reason: a swarm where
half the volunteers run another template would otherwise fill the log.
Requests *for* that peer's model still reach it: the swarm's model table
(:mod:`p2pinfer.core.swarm_models`, fed by model announcements) is separate.
"""

from __future__ import annotations

from collections import OrderedDict
import logging

__all__ = ["OtherModels"]

log = logging.getLogger(__name__)

_MAX_REMEMBERED = 1024


class OtherModels:
    def __init__(self, own_fingerprint: str, limit: int = _MAX_REMEMBERED) -> None:
        self.own = own_fingerprint
        self._limit = limit
        self._peers: OrderedDict[str, str] = OrderedDict()
        self._logged: set[tuple[str, str]] = set()

    def note(self, peer_id: str, fingerprint: str | None, where: str, *, conclusive: bool = True) -> bool:
        """``peer_id`` showed fingerprint ``fingerprint`` (``None``: unknown) in ``where``.

        ``conclusive``: the peer's own engine said so (it refused us with
        MODEL_MISMATCH, or asked us with its fingerprint), so it is kept out
        of the view. A gossip message for another fingerprint on our topic
        is only logged: it may be a relay's or a buggy peer's, and its sender
        keeps its other, valid messages. Returns True when this (peer,
        fingerprint) is new and was logged.
        """
        fp = (fingerprint or "unknown")[:64]
        if fp == self.own:
            return False
        if conclusive:
            self._peers[peer_id] = fp
            self._peers.move_to_end(peer_id)
            while len(self._peers) > self._limit:
                self._peers.popitem(last=False)
        key = (peer_id, fp)
        if key in self._logged:
            return False
        if len(self._logged) >= 4 * self._limit:  # a flood of identities: stop logging
            log.debug("peer %s runs another model (fingerprint %s), seen in %s", peer_id, fp, where)
            return False
        self._logged.add(key)
        log.warning(
            "peer %s runs another model (fingerprint %s; ours is %s), seen in %s: "
            "its digests are ignored and no request for our model is routed to it "
            "(requests for its model are, through the swarm's model table)",
            peer_id, fp, self.own, where,
        )
        return True

    def cleared(self, peer_id: str) -> None:
        """``peer_id`` now presents our fingerprint (it was reconfigured and restarted)."""
        self._peers.pop(peer_id, None)

    def __contains__(self, peer_id: object) -> bool:
        return peer_id in self._peers

    def as_dict(self) -> dict[str, str]:
        return dict(self._peers)
