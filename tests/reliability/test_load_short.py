"""A short version of `p2pinfer bench load`: overload is refused explicitly, nothing is lost."""

from __future__ import annotations

from p2pinfer.core.costmodel import EngineCostModel
from p2pinfer.lab.load_bench import run_load


def test_overloaded_swarm_refuses_with_retry_after_and_loses_nothing() -> None:
    # 2 nodes admit 2 requests each; 24 clients must see refusals.
    result = run_load(nodes=2, clients=24, duration_s=4.0, max_tokens=2, seed=3, max_concurrent=2)
    outcomes = result["outcomes"]
    assert result["lost"] == 0, result["lost_examples"]
    assert outcomes.get("ok", 0) > 0
    assert outcomes.get("503_retry_after", 0) > 0
    assert set(outcomes) <= {"ok", "503_retry_after"}, outcomes
    assert result["nodes_alive_at_end"] == 2
    assert result["answered_explicitly"] == result["requests_sent"]
    # The JSON says what ran: the simulated engine's calibration, and the time asked beside the time taken
    # (the requests in flight at the end still finish).
    assert result["cost_model"] == EngineCostModel().as_dict()
    assert result["requested_duration_s"] == 4.0 <= result["duration_s"]
