"""gossipsub's heartbeat in a live node: every HEARTBEAT_S (2 s), its score decay rescaled to match (issue 14)."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from libp2p.pubsub.gossipsub import GossipSub

from p2pinfer.lab.node_process import fast_config
from p2pinfer.net.host import HEARTBEAT_S
from p2pinfer.net.sanctions import DECAY_PER_S
from p2pinfer.node import Node


async def test_the_heartbeat_runs_every_two_seconds_and_penalties_still_decay_per_second(monkeypatch: pytest.MonkeyPatch) -> None:
    beats: list[float] = []
    original = GossipSub.mesh_heartbeat

    def counting(self: Any) -> Any:
        beats.append(trio.current_time())
        return original(self)

    monkeypatch.setattr(GossipSub, "mesh_heartbeat", counting)
    async with Node(fast_config()) as node:
        await trio.sleep(0.3)  # past the initial delay
        start = len(beats)
        t0 = trio.current_time()
        await trio.sleep(5.0)
        seconds = trio.current_time() - t0
        gossipsub = node._libp2p.gossipsub
        assert gossipsub.heartbeat_interval == HEARTBEAT_S >= 2
        # A 1 s heartbeat would beat 5 times; a loaded machine beats less often, never more.
        assert len(beats) - start <= seconds / 2 + 1, beats
        gaps = [b - a for a, b in zip(beats, beats[1:])]
        assert all(g >= HEARTBEAT_S - 0.05 for g in gaps), gaps
        # One heartbeat decays a penalty by the per-second rate over two seconds.
        decay = gossipsub.scorer.params.p5_behavior_penalty_decay
        assert abs(decay - DECAY_PER_S**HEARTBEAT_S) < 1e-12


async def test_a_peer_that_pruned_us_and_grafts_again_is_not_penalised() -> None:
    """py-libp2p's GRAFT-flood check penalised a peer for grafting us soon
    after *it* pruned *us* (-9.8 on its score at once: issue 14, honest peers
    penalising each other). With it off, B's GRAFT right after its PRUNE is
    only refused under the backoff rule, and B's score stays untouched."""
    async with Node(fast_config()) as b, Node(fast_config(bootstrap=(b.addrs[0],))) as a:
        await a.wait_for_peers(1)
        ga, gb = a._libp2p.gossipsub, b._libp2p.gossipsub
        a_id, b_id, topic = a._libp2p.host.get_id(), b._libp2p.host.get_id(), a.topic
        for _ in range(100):  # B in A's mesh on the digest topic
            if b_id in ga.mesh.get(topic, ()):
                break
            await trio.sleep(0.05)
        await gb.emit_prune(topic, a_id, False, False)
        await trio.sleep(0.5)
        await gb.emit_graft(topic, a_id)
        await trio.sleep(0.5)
        assert b_id in ga.back_off[topic]  # the GRAFT was seen (and refused: B's own backoff)
        assert ga.scorer.graft_flood_penalties.get(b_id, 0.0) == 0.0
        assert ga.scorer.score(b_id, [topic]) >= 0.0
