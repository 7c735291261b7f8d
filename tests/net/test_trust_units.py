"""The pieces of the trust boundary on their own: sanctions, other models, the lying router."""

from __future__ import annotations

import logging

from p2pinfer.core.blocks import ModelFingerprint
from p2pinfer.core.digest import Digest
from p2pinfer.core.radix import RadixTree
from p2pinfer.lab.lying import LyingRouter
from p2pinfer.net.other_models import OtherModels
from p2pinfer.net.sanctions import DECAY_PER_S, PUBLISH_THRESHOLD, PeerSanctions, gossip_score_params, penalty_lasting
from p2pinfer.net.wire import fingerprint_in_message, mismatch_message

PEER = "12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN"


class FakeScorer:
    def __init__(self) -> None:
        self.penalties: list[tuple[str, float]] = []

    def penalize_behavior(self, peer, amount: float) -> None:
        self.penalties.append((peer.to_base58(), amount))


def test_sanction_lasts_distrust_s_and_is_reapplied_after_a_reconnect(caplog):
    scorer = FakeScorer()
    sanctions = PeerSanctions(scorer, distrust_s=120.0)
    with caplog.at_level(logging.WARNING, logger="p2pinfer.net.sanctions"):
        sanctions.distrust(PEER, "it advertised 480 cached prompt tokens and reused 0", now=1000.0)
    assert "distrusted for 120 s" in caplog.text and "reused 0" in caplog.text
    assert sanctions.is_distrusted(PEER, 1000.0 + 119.9)
    assert sanctions.remaining(1060.0) == {PEER: 60.0}
    # The gossipsub penalty decays below the publish threshold as the sanction ends.
    (peer, amount), = scorer.penalties
    assert peer == PEER
    assert amount * DECAY_PER_S**119 > PUBLISH_THRESHOLD > amount * DECAY_PER_S**121
    # gossipsub forgets a disconnected peer's score: a reconnect gets what is left.
    assert sanctions.reapply(PEER, now=1090.0)
    assert abs(scorer.penalties[-1][1] - penalty_lasting(30.0)) < 1e-9
    assert not sanctions.is_distrusted(PEER, 1000.0 + 120.0)
    assert not sanctions.reapply(PEER, now=1200.0) and sanctions.remaining(1200.0) == {}


def test_score_params_leave_honest_peers_at_zero_and_only_penalties_count():
    from libp2p.peer.id import ID
    from libp2p.pubsub.score import PeerScorer

    scorer = PeerScorer(gossip_score_params())
    peer = ID.from_base58(PEER)
    for _ in range(50):  # an honest, busy peer
        scorer.on_first_delivery(peer, "t")
        scorer.on_mesh_delivery(peer, "t")
        scorer.on_invalid_message(peer, "t")  # P4 is off: even these do not count
    assert scorer.score(peer, ["t"]) == 0 and scorer.allow_publish(peer, ["t"])
    scorer.penalize_behavior(peer, penalty_lasting(60.0))
    assert not scorer.allow_publish(peer, ["t"]) and not scorer.allow_gossip(peer, ["t"])
    for _ in range(61):
        scorer.on_heartbeat()
    assert scorer.allow_publish(peer, ["t"])


def test_the_gossipsub_penalty_ends_with_the_sanction_even_when_heartbeats_lag():
    from libp2p.peer.id import ID
    from libp2p.pubsub.score import PeerScorer

    scorer = PeerScorer(gossip_score_params())
    peer = ID.from_base58(PEER)
    sanctions = PeerSanctions(scorer, distrust_s=20.0)
    sanctions.distrust(PEER, "it overclaimed", now=1000.0)
    for _ in range(5):  # a loaded machine: 5 heartbeats in 20 s instead of 20
        scorer.on_heartbeat()
    assert not scorer.allow_publish(peer, ["t"])
    assert sanctions.remaining(1019.0) == {PEER: 1.0} and not scorer.allow_publish(peer, ["t"])
    sanctions.expire(1020.0)
    assert scorer.allow_publish(peer, ["t"])
    # What is left sits just under the threshold: more garbage cuts it off again.
    sanctions.invalid_gossip(PEER)
    assert not scorer.allow_publish(peer, ["t"])


def test_other_models_are_logged_once_per_peer_and_fingerprint(caplog):
    models = OtherModels("aaaa")
    with caplog.at_level(logging.WARNING, logger="p2pinfer.net.other_models"):
        assert models.note(PEER, "bbbb", "a digest pull")
        assert not models.note(PEER, "bbbb", "a forwarded request")
        assert not models.note(PEER, "aaaa", "a digest pull")  # our own fingerprint: nothing to say
        assert models.note(PEER, "cccc", "a digest pull")  # it switched to yet another model
        assert models.note("other-peer", "dddd", "gossip on our topic", conclusive=False)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert "fingerprint bbbb; ours is aaaa" in lines[0] and "a digest pull" in lines[0]
    assert PEER in models and "other-peer" not in models  # gossip alone does not exclude a peer
    assert models.as_dict() == {PEER: "cccc"}
    models.cleared(PEER)
    assert PEER not in models


def test_mismatch_messages_name_the_fingerprint():
    msg = mismatch_message("0123456789abcdef", "fedcba9876543210")
    assert fingerprint_in_message(msg) == "0123456789abcdef"
    assert fingerprint_in_message(mismatch_message("00ff")) == "00ff"
    assert fingerprint_in_message("BUSY: queue full") is None


def test_lying_router_advertises_what_its_peers_advertise():
    fp = ModelFingerprint("m", "t", "c")
    liar = LyingRouter("liar", fp, RadixTree(1000))
    peer_fp = liar.fingerprint_hex
    claimed = frozenset({11, 22, 33})
    assert liar.on_digest(Digest("full", "honest", peer_fp, 1, 0, claimed, epoch=5), 0.0) == "applied"
    # Nothing is cached, yet the next digest it publishes claims all three.
    assert liar.cache.total_tokens == 0
    delta = liar.tracker.take_delta()
    assert delta is not None and delta.added == claimed
    # A repeat of the same digest (stale) renews claims that were dropped.
    liar.tracker._held.discard(11)
    assert liar.on_digest(Digest("full", "honest", peer_fp, 1, 0, claimed, epoch=5), 0.0) == "stale"
    assert 11 in liar.tracker.hashes
