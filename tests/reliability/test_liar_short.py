"""A real lying node process is found out and cut off (the machinery of `p2pinfer bench liar`).

The fourth node runs the lab's lying router: it advertises every prefix
its peers advertise. Requests for those prefixes enter at the three honest
nodes, one at a time, until every honest node has distrusted the liar; then
20 more follow, and none of them may reach it. The time-to-first-token
comparison with an honest swarm is the benchmark's job (docs/results.md).
"""

from __future__ import annotations

import pytest

from p2pinfer.lab.liar_bench import LiarSwarm, workload
from p2pinfer.net.sanctions import PUBLISH_THRESHOLD
from p2pinfer.lab.node_process import wait_until

pytestmark = pytest.mark.slow

GROUPS, PREFIX, SUFFIX = 6, 480, 32


def test_lying_node_gets_no_traffic_after_at_most_20_mispredictions() -> None:
    # The paper policy follows the longest advertised match (ties at random),
    # so the lie attracts work whatever the RTTs on a loaded test machine.
    # The liar caches one block: with the benchmark's two-request cache it
    # holds what it was just sent, its next claim for that group is true, and
    # an origin's trust climbs back (CI saw one origin still trusting it after
    # 100 requests). Here every forward it serves is a misprediction.
    swarm = LiarSwarm(
        "liar", prefix_tokens=PREFIX, suffix_tokens=SUFFIX, speed=0.1, policy="paper", fourth_cache_tokens=16
    )
    try:
        honest, liar = swarm.honest, swarm.x
        wait_until(swarm.meshed, 60, interval_s=0.2, what="a full mesh")
        seeds, plan = workload(4, GROUPS, PREFIX, SUFFIX, 100)
        for wait in swarm.seed(seeds):
            wait(60)
        wait_until(lambda: swarm.learned(GROUPS, (PREFIX + SUFFIX) // 16), 30, interval_s=0.2, what="the lie in place")
        assert liar.call("status")["digest"]["blocks"] >= GROUPS * (PREFIX + SUFFIX) // 16

        def distrusted_by() -> int:
            return sum(liar.peer_id in node.call("status")["distrusted_peers"] for node in honest)

        sent_to_liar = mispredictions = 0
        steps = iter(plan)
        for _, _, entry, tokens in steps:
            result = honest[entry].call("generate", tokens=tokens, max_tokens=2, timeout_s=60)
            if result["served_by"] == liar.peer_id:
                sent_to_liar += 1
                mispredictions += result["reused_tokens"] < result["predicted_reused_tokens"]
            if distrusted_by() == 3:
                break
        assert distrusted_by() == 3, f"after {sent_to_liar} forwards to the liar"
        assert 1 <= mispredictions <= 20

        # From now on the liar receives nothing, though it still claims every group.
        for _ in range(20):
            _, _, entry, tokens = next(steps)
            result = honest[entry].call("generate", tokens=tokens, max_tokens=2, timeout_s=60)
            assert all(att["target"] != liar.peer_id for att in result["attempts"]), result["attempts"]
            assert result["served_by"] != liar.peer_id and result["reused_tokens"] == PREFIX
        status = liar.call("status")
        assert status["counters"]["forwards_served"] == sent_to_liar  # nothing else reached it
        assert status["digest"]["blocks"] >= GROUPS * (PREFIX + SUFFIX) // 16
        for node in honest:  # gossipsub's own score shuts it out too (publish threshold)
            scores = node.call("status")["gossip_scores"]
            assert scores[liar.peer_id] < -PUBLISH_THRESHOLD
            assert liar.peer_id not in node.call("view")
    finally:
        swarm.close()
