"""A distrusted peer stays out for ``distrust_s``, in live nodes (one trio loop).

It falls silent in our view (its gossip is dropped), cannot come back by
reconnecting, and is re-admitted with a fresh trust once the sanction ends.
"""

from __future__ import annotations

import time

from libp2p.peer.id import ID
import trio

from p2pinfer.core.router import GossipConfig, RouterConfig, TrustConfig
from p2pinfer.net.sanctions import PUBLISH_THRESHOLD
from p2pinfer.lab.node_process import fast_config, wait_for
from p2pinfer.node import Node


def forge_claim(node: Node, peer_id: str, tokens: list[int]) -> None:
    """Make ``node`` believe that ``peer_id`` caches ``tokens`` (it does not)."""
    from p2pinfer.core.digest import Digest

    state = node.router.view.get(peer_id)
    lie = Digest(
        "delta", peer_id, node.router.fingerprint_hex, state.version + 1, state.version,
        frozenset(node.router.hasher.hashes(tokens)), epoch=state.epoch,
    )
    assert node.router.on_digest(lie, time.monotonic()) == "applied"


async def test_distrusted_peer_stays_out_through_expiry_and_reconnect_then_returns():
    gossip = GossipConfig(delta_interval_s=0.1, full_interval_s=1.0, load_interval_s=0.25, keepalive_interval_s=0.5, peer_ttl_s=2.0)
    # The checks made during the sanction take a few seconds here; the window
    # is wide enough for a machine several times slower, and the test asserts
    # that they really ran inside it.
    distrust_s = 20.0
    router = RouterConfig(policy="paper", gossip=gossip, trust=TrustConfig(distrust_s=distrust_s))
    async with Node(fast_config(speed=0.1, gossip=gossip)) as b, Node(
        fast_config(bootstrap=(b.addrs[0],), speed=0.1).replace(router=router)
    ) as a:
        await a.wait_for_peers(1)
        for i in range(6):  # forwards that realise nothing of what was claimed
            if b.peer_id in a.sanctions.remaining():
                break
            tokens = list(range(1000 + 400 * i, 1320 + 400 * i))
            forge_claim(a, b.peer_id, tokens)
            assert (await a.complete(tokens, max_tokens=1)).served_by == b.peer_id
        sanctioned_at = time.monotonic()
        assert b.peer_id in a.sanctions.remaining() and a.counters.peers_distrusted == 1
        assert a.status()["gossip_scores"][b.peer_id] < -PUBLISH_THRESHOLD

        # Its gossip no longer counts: it leaves the view although connected.
        await wait_for(lambda: b.peer_id not in a.router.view, 10)
        assert b.peer_id in a.membership.connected()
        # A reconnect does not wash the sanction off (gossipsub forgets scores
        # on disconnect; the node puts the penalty back, and does not pull).
        pulls = a.counters.pulls_done
        await a.host.disconnect(ID.from_base58(b.peer_id))
        await wait_for(lambda: ID.from_base58(b.peer_id) not in a.host.get_connected_peers(), 5)
        await wait_for(lambda: ID.from_base58(b.peer_id) in a.host.get_connected_peers(), 10)  # bootstrap peers are redialled
        await wait_for(lambda: a.status()["gossip_scores"].get(b.peer_id, 0) < -PUBLISH_THRESHOLD, 5)
        await trio.sleep(1.0)
        assert b.peer_id not in a.router.view and a.counters.pulls_done == pulls
        # Exactly what gossipsub does on a disconnect; the node tops the penalty up within a second or two.
        scorer = a._libp2p.gossipsub.scorer
        scorer.remove_peer(ID.from_base58(b.peer_id))
        assert scorer.score(ID.from_base58(b.peer_id), [a.topic]) == 0
        await wait_for(lambda: a.status()["gossip_scores"].get(b.peer_id, 0) < -PUBLISH_THRESHOLD, 3)
        # Requests for what it claimed stay here meanwhile.
        assert (await a.complete(list(range(1000, 1320)), max_tokens=1)).served_locally
        assert b.peer_id in a.sanctions.remaining(), "the checks above outlasted the sanction window"

        # Once the sanction ends it is heard again, with a fresh trust.
        await wait_for(lambda: b.peer_id in a.router.view and a.router.view.get(b.peer_id).fingerprint, distrust_s + 15)
        assert time.monotonic() - sanctioned_at >= distrust_s - 0.5
        assert a.router.view.get(b.peer_id).trust == 1.0 and a.sanctions.remaining() == {}
