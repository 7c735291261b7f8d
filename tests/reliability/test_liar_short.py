"""A short version of `p2pinfer bench liar`: a real lying node process is found out and cut off.

The fourth node runs with ``debug_overclaim``: it advertises every prefix
its peers advertise. The three honest origins forward to it, see realised
reuse fall short of the prediction, distrust it, and send it nothing more.
The time-to-first-token comparison with an honest swarm is the benchmark's
job (docs/results.md), not this test's.
"""

from __future__ import annotations

import pytest

from p2pinfer.cli.bench_liar import run_liar
from p2pinfer.net.sanctions import PUBLISH_THRESHOLD

pytestmark = pytest.mark.slow


def test_lying_node_is_cut_off_after_at_most_20_mispredictions() -> None:
    # The paper policy follows the longest advertised match (ties at random),
    # so the lie attracts work whatever the RTTs on a loaded test machine.
    result = run_liar(
        groups=6, prefix_tokens=480, requests=60, rate_rps=10.0, speed=0.1, seed=4, scenarios=("liar",), policy="paper"
    )
    liar = result["scenarios"]["liar"]
    assert liar["failed"] == 0, liar["errors"]
    # The lie was in place and attracted traffic...
    assert liar["fourth_node_advertised_blocks"] >= 6 * 512 // 16
    assert liar["mispredictions_by_fourth_node"] >= 1
    # ...until every honest origin distrusted it, after at most 20 mispredictions.
    assert liar["mispredictions_by_fourth_node"] <= 20
    assert liar["distrusted_by"] == 3
    # Then it received nothing: the last request it got was early, and what
    # it served is exactly what the origins sent it before the cut-off.
    assert result["requests_after_cutoff"] >= 20, result["cutoff_request"]
    assert liar["fourth_node_forwards_served"] == liar["requests_to_fourth_node"]
    # gossipsub's own score shuts it out too (publish threshold).
    assert all(score is not None and score < -PUBLISH_THRESHOLD for score in liar["gossip_score_of_fourth_node"])
