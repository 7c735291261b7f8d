"""A lying node in the simulator is sanctioned as a live node sanctions one."""

from __future__ import annotations

from typing import Any

from p2pinfer.core.radix import RadixTree
from p2pinfer.core.router import Router, TrustConfig
from p2pinfer.lab.lying import LyingRouter
from p2pinfer.sim import SimConfig, Simulator


class LiarSim(Simulator):
    """Node 0 advertises every prefix its peers advertise."""

    def _new_router(self, idx: int, node_id: str, cache: RadixTree) -> Router:
        if idx != 0:
            return super()._new_router(idx, node_id, cache)
        return LyingRouter(node_id, self.fingerprint, cache, config=self.router_config, seed=idx)


def test_a_distrusted_peer_leaves_the_view_and_its_gossip_is_dropped(mmlu_300: Any) -> None:
    _, (reqs, encoder, info) = mmlu_300
    config = SimConfig(nodes=4, policy="paper", seed=7, trust=TrustConfig(distrust_s=1e6))
    sim = LiarSim(config, reqs, encoder, workload=info)
    sim.run()
    liar = sim.nodes[0].id
    honest = sim.nodes[1:]
    assert sim.sanctions >= 1 and sim.gossip_dropped > 0
    for node in honest:
        if liar in node.sanctioned:
            # Out of the view for good (its gossip never reached this node again).
            assert liar not in node.router.view
    assert sum(liar in n.sanctioned for n in honest) == sim.sanctions
