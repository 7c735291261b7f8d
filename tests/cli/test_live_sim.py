"""The simulator's replay of a live bench run (p2pinfer/live_sim.py)."""

from __future__ import annotations

import pytest

from p2pinfer.core.costmodel import EngineCostModel
from p2pinfer.live_bench import LiveRequest
from p2pinfer.live_sim import fit_engine_timing, live_cost_model, simulate_live_run

HEADER = "The following are multiple choice questions (with answers) about anatomy. " * 20


def _requests(n: int, entry: int | None = None) -> list[LiveRequest]:
    return [LiveRequest("anatomy", f"{HEADER}Question {i}: which bone?", 1, i % 2 if entry is None else entry) for i in range(n)]


def test_cost_model_takes_the_nodes_median_speed() -> None:
    model = live_cost_model([9.0, 5.0, 6.0])
    base = EngineCostModel()
    assert model.prefill_ms_per_token == 6.0
    assert model.decode_ms_per_token == pytest.approx(base.decode_ms_per_token * 6.0 / base.prefill_ms_per_token)
    assert "median of 3" in model.source
    assert live_cost_model([]) == base  # no estimate: the calibrated default


def test_replay_serves_every_arrival_and_reuses_the_shared_header() -> None:
    reqs = _requests(12)
    sent = [2.0 * i for i in range(12)]  # one at a time: no queueing
    local = simulate_live_run(reqs, sent, policy="local", nodes=2, cache_tokens=4000, one_way_ms=1.0,
                              cost=EngineCostModel())
    assert local["forwarded_share"] == 0.0
    assert local["hit_rate"] > 0.5  # each node recomputes the header once, then reuses it
    cost = simulate_live_run(reqs, sent, policy="cost", nodes=2, cache_tokens=4000, one_way_ms=1.0,
                             cost=EngineCostModel())
    assert cost["hit_rate"] >= local["hit_rate"]  # the second node forwards to the first holder
    assert cost["ttft_ms"]["mean"] <= local["ttft_ms"]["mean"]


def test_replay_uses_the_measured_delay() -> None:
    reqs, sent = _requests(6), [3.0 * i for i in range(6)]
    near = simulate_live_run(reqs, sent, policy="round-robin", nodes=2, cache_tokens=4000, one_way_ms=1.0, cost=EngineCostModel())
    far = simulate_live_run(reqs, sent, policy="round-robin", nodes=2, cache_tokens=4000, one_way_ms=400.0, cost=EngineCostModel())
    # round-robin forwards half the requests whatever the delay; each forward pays two one-way hops.
    assert far["ttft_ms"]["mean"] > near["ttft_ms"]["mean"] + 300


def test_replay_needs_one_send_time_per_request() -> None:
    with pytest.raises(ValueError, match="one send time per request"):
        simulate_live_run(_requests(3), [0.0], policy="cost", nodes=2, cache_tokens=4000, one_way_ms=1.0, cost=EngineCostModel())


def test_engine_timing_fit_recovers_overhead_restore_and_speed() -> None:
    samples = []
    for i in range(40):
        prompt = 200 + 7 * i
        reused = 160 if i % 2 else 0
        ms = 30.0 + (12.0 if reused else 0.0) + (prompt - reused) * 6.5
        samples.append((prompt, reused, ms))
    model = fit_engine_timing(samples)
    assert model is not None
    assert model.prefill_ms_per_token == pytest.approx(6.5, rel=1e-3)
    assert model.request_overhead_ms == pytest.approx(30.0, abs=0.1)
    assert model.cache_hit_overhead_ms == pytest.approx(12.0, abs=0.1)
    assert "fit of 40 engine timings" in model.source


def test_engine_timing_fit_refuses_too_few_or_unphysical_samples() -> None:
    assert fit_engine_timing([(100, 0, 500.0)] * 3) is None
    falling = [(100 + 10 * i, 0, 1000.0 - 5 * i) for i in range(20)]  # slower for fewer tokens
    assert fit_engine_timing(falling) is None
