"""The simulator's replay of a live bench run (p2pinfer/live_sim.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from p2pinfer.core.costmodel import EngineCostModel
from p2pinfer.lab.live_bench import LiveRequest
from p2pinfer.lab.live_sim import fit_engine_timing, full_speed_work, live_cost_model, predict_live_run, simulate_live_run

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


def test_replay_serves_every_request_and_reuses_the_shared_header() -> None:
    reqs = _requests(12)
    common = dict(nodes=2, cache_tokens=4000, one_way_ms=1.0, cost=EngineCostModel(), concurrency=1)
    local = simulate_live_run(reqs, policy="local", **common)
    assert local["forwarded_share"] == 0.0
    assert local["hit_rate"] > 0.5  # each node recomputes the header once, then reuses it
    cost = simulate_live_run(reqs, policy="cost", **common)
    assert cost["hit_rate"] >= local["hit_rate"]  # the second node forwards to the first holder
    assert cost["ttft_ms"]["mean"] <= local["ttft_ms"]["mean"]


def test_replay_uses_the_measured_delay_and_the_client_loop() -> None:
    reqs = _requests(6)
    common = dict(nodes=2, cache_tokens=4000, cost=EngineCostModel())
    near = simulate_live_run(reqs, policy="round-robin", one_way_ms=1.0, concurrency=1, **common)
    far = simulate_live_run(reqs, policy="round-robin", one_way_ms=400.0, concurrency=1, **common)
    # Each forward pays two one-way hops (800 ms more here).
    assert far["forwarded_share"] > 0
    assert far["ttft_ms"]["mean"] - near["ttft_ms"]["mean"] > 0.5 * 800 * far["forwarded_share"]
    crowded = simulate_live_run(reqs, policy="local", one_way_ms=1.0, concurrency=6, **common)
    alone = simulate_live_run(reqs, policy="local", one_way_ms=1.0, concurrency=1, **common)
    assert crowded["ttft_ms"]["mean"] > alone["ttft_ms"]["mean"]  # all at once: they queue


def test_replay_needs_requests() -> None:
    with pytest.raises(ValueError, match="no requests"):
        simulate_live_run([], policy="cost", nodes=2, cache_tokens=4000, one_way_ms=1.0, cost=EngineCostModel(), concurrency=1)


def test_full_speed_work_under_processor_sharing() -> None:
    assert full_speed_work([(0, 2)] * 4, 2) == [1.0] * 4  # four on two cores: half speed
    assert full_speed_work([(0, 1), (0.5, 1.5)], 1) == [0.75, 0.75]
    assert full_speed_work([(0, 1), (2, 3)], 1) == [1.0, 1.0]  # never overlapping: full speed


def test_prediction_from_outcomes_fits_the_engine_and_runs_both_models() -> None:
    reqs = _requests(12)
    outcomes = [
        {"ok": True, "sent_s": 2.0 * i, "ttft_ms": 900.0, "engine_prefill_ms": 30 + 4.0 * (200 + 10 * i - 160 * (i % 2)),
         "prompt_tokens": 200 + 10 * i, "reused": 160 * (i % 2)}
        for i in range(12)
    ]
    pred = predict_live_run(reqs, outcomes, policy="local", nodes=2, cache_tokens=4000, concurrency=1, rtt_ms=2.0,
                            cores=2)
    assert pred["one_way_ms"] == 1.0 and pred["shared_cores"] == 2.0 and pred["concurrency"] == 1
    assert pred["cost_model"]["prefill_ms_per_token"] == pytest.approx(4.0, rel=1e-3)  # never overlapping: as measured
    assert pred["live_over_simulated_mean_ttft"] == pytest.approx(900.0 / pred["ttft_ms"]["mean"], rel=1e-3)
    assert pred["one_machine_per_node"]["ttft_ms"]["mean"] > 0


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


def test_live_requests_by_subject_name_use_exactly_those_subjects() -> None:
    from p2pinfer.lab.live_bench import mmlu_live_requests

    reqs, meta = mmlu_live_requests(20, 3, subjects=["anatomy", "philosophy"], seed=2)
    assert meta["subjects"] == ["anatomy", "philosophy"]
    assert {r.label.split("/")[0] for r in reqs} <= {"anatomy", "philosophy"}
    assert {r.entry for r in reqs} <= {0, 1, 2}
    with pytest.raises(ValueError, match="unknown MMLU subjects: no_such_subject"):
        mmlu_live_requests(2, 2, subjects=["anatomy", "no_such_subject"])


def test_swarm_replay_takes_the_runs_slots_per_node(tmp_path: Path) -> None:
    """``bench swarm-replay``: nodes of the live run's ``slots_per_node``; one when the JSON has none (older runs)."""
    from p2pinfer.lab.live_bench import mmlu_live_requests
    from p2pinfer.lab.live_experiment import replay_result

    reqs, meta = mmlu_live_requests(16, 2, max_subjects=2, seed=3, max_tokens=8)
    outcomes = [
        {"ok": True, "sent_s": 0.5 * i, "ttft_ms": 800.0, "engine_prefill_ms": 600.0, "prompt_tokens": 150, "reused": 0}
        for i in range(len(reqs))
    ]
    data = {
        "nodes": 2, "requests": 16, "concurrency": 4, "seed": 3, "max_tokens": 8, "cache_tokens_per_node": 20_000,
        "workload": {"subjects": meta["subjects"]}, "slots_per_node": 4,
        "policies": [{"policy": "cost", "outcomes": outcomes, "peer_rtt_ms_median": 1.0}],
    }
    path = tmp_path / "run.json"
    path.write_text(json.dumps(data))
    four = replay_result(path, cores=2)["policies"][0]["simulator"]
    assert four["slots_per_node"] == 4 and four["one_machine_per_node"]["slots_per_node"] == 4
    del data["slots_per_node"]
    path.write_text(json.dumps(data))
    one = replay_result(path, cores=2)["policies"][0]["simulator"]
    assert one["slots_per_node"] == 1
    assert one["ttft_ms"] != four["ttft_ms"]
