"""Simulated nodes with several slots (issue 18, part 4; p2pinfer/sim/batching.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from p2pinfer.cli.main import app
from p2pinfer.core.costmodel import EngineCostModel
from p2pinfer.core.engine_queue import shared_prefix_len
from p2pinfer.sim.model import Job, SimNode
from p2pinfer.sim.runner import WorkloadSpec, build_requests
from p2pinfer.sim.simulator import SimConfig, Simulator
from p2pinfer.workloads import PromptEncoder, load_tokenizer
from p2pinfer.workloads.base import Prompt, TimedRequest

ENCODER = PromptEncoder(load_tokenizer("approx"))
WORDS = ["alpha", "brick", "cloud", "delta", "ember", "fjord", "grain", "haven", "ivory", "jolly", "kayak", "lemon"]
DECODE_ONLY = EngineCostModel(prefill_ms_per_token=0.0, cache_hit_overhead_ms=0.0, request_overhead_ms=0.0)
"""Free prefills: what is left is decode steps, so times follow from the batch curve alone."""


FIELD_NOTES_ENGINE = EngineCostModel(4.35, 12.5, 2.0, 1.0, "field notes (EngineCostModel's defaults until 9b25909)")


def _prompt(i: int, words: int = 40, prefix: str = "") -> str:
    """A prompt that shares no leading block with another ``i`` (unless they share ``prefix``)."""
    w = WORDS[i % len(WORDS)]
    return prefix + " ".join(f"{w}{i}x{j}" for j in range(words))


def _requests(texts: list[str], output_tokens: int, times: list[float] | None = None) -> list[TimedRequest]:
    times = times or [0.0] * len(texts)
    return [TimedRequest(t, Prompt(f"r{i}", (text,), output_tokens=output_tokens), entry=0) for i, (t, text) in enumerate(zip(times, texts))]


def _one_node(slots: int, requests: list[TimedRequest], cost: EngineCostModel, cls: type[Simulator] = Simulator) -> Simulator:
    sim = cls(SimConfig(nodes=1, slots=slots, cost=cost, warmup=0.0, latency="0"), requests, ENCODER)
    sim.run()
    return sim


# -- one slot is the old simulator ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        # Measured with main at 5b8bdbd, before slots existed in the simulator, on the cost model's
        # defaults of the time (the field notes'), which these runs therefore name.
        (SimConfig(seed=7, shared_cores=2, concurrency=16, cost=FIELD_NOTES_ENGINE),
         (23781.712, 20251.5, 56651.733, 0.2389, 0.2, 470.858, 16986)),
        (SimConfig(seed=7, churn_interval_s=15.0, cost=FIELD_NOTES_ENGINE),
         (37317.19, 24740.905, 165841.291, 0.2099, 0.2593, 349.918, 10005)),
    ],
)
def test_one_slot_reproduces_the_simulator_before_slots(config: SimConfig, expected: tuple[float, ...]) -> None:
    assert config.slots == 1
    spec = WorkloadSpec(requests=300, tokenizer="approx")
    reqs, enc, info = build_requests(spec, 4, 7)
    r = Simulator(config, reqs, enc, workload=info).run()
    got = (r["ttft_ms"]["mean"], r["ttft_ms"]["p50"], r["ttft_ms"]["p99"], r["hit_rate"], r["forwarded_share"],
           r["sim"]["virtual_s"], r["sim"]["events"])
    assert got == expected


# -- batching --------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [2, 4, 8])
def test_k_requests_on_k_slots_finish_sooner_by_the_batch_curve(k: int) -> None:
    tokens = 20
    reqs = _requests([_prompt(i, 12) for i in range(k)], tokens)
    assert all(len(ENCODER.encode(r.prompt)) < 128 for r in reqs)  # one chunk each
    serial = _one_node(1, reqs, DECODE_ONLY)
    batched = _one_node(k, reqs, DECODE_ONLY)
    # One slot: k answers one after the other, (tokens - 1) single-sequence steps each.
    assert serial.now == pytest.approx(k * (tokens - 1) * DECODE_ONLY.decode_ms_per_token / 1000)
    # k slots: request j's (free) prompt goes in iteration j and it decodes from that iteration's step
    # on, (tokens - 1) steps; a step costs decode_step_ms(sequences in it).
    expected = 0.0
    for m in range(1, k + tokens - 1):
        sequences = sum(1 for j in range(1, k + 1) if j <= m <= j + tokens - 2)
        expected += DECODE_ONLY.decode_step_ms(sequences)
    assert batched.now == pytest.approx(expected / 1000)
    ratio = serial.now / batched.now
    per_step = k * DECODE_ONLY.decode_ms_per_token / DECODE_ONLY.decode_step_ms(k)
    assert 1 < ratio <= per_step  # the ramp-up steps are smaller batches
    assert [len(r.tokens) for r in batched.completed] == [0] * k and len(batched.completed) == k


def test_a_long_prompt_delays_the_others_tokens_by_one_chunk_at_most() -> None:
    cost = EngineCostModel()
    gaps: list[float] = []

    class Spy(Simulator):
        last: float | None = None

        def _step_done(self, node: SimNode, decoding: list[Job], began: float) -> None:
            if any(j.req.rid == 0 for j in decoding):
                if Spy.last is not None:
                    gaps.append(self.now - Spy.last)
                Spy.last = self.now
            super()._step_done(node, decoding, began)

    # Request 0: a short prompt and a long answer; request 1 arrives while it decodes, with ~20 chunks of prompt.
    reqs = [
        TimedRequest(0.0, Prompt("r0", (_prompt(0, 20),), output_tokens=200), entry=0),
        TimedRequest(0.2, Prompt("r1", (_prompt(1, 1500),), output_tokens=2), entry=0),
    ]
    assert len(ENCODER.encode(reqs[1].prompt)) > 10 * 128
    sim = _one_node(2, reqs, cost, Spy)
    chunk_ms = 128 * cost.prefill_ms_per_token + cost.request_overhead_ms
    # While request 1 prefills, request 0 decodes alone: one chunk, then its step, and so on.
    assert max(gaps) * 1000 == pytest.approx(chunk_ms + cost.decode_step_ms(1), rel=1e-6)
    assert sum(1 for g in gaps if g * 1000 > cost.decode_step_ms(2) * 1.001) >= 10  # it did go on during the prefill
    assert min(gaps) * 1000 == pytest.approx(cost.decode_step_ms(1), rel=1e-6)
    first = {r.rid: r.first_token for r in sim.completed}
    assert first[1] is not None and first[1] < 0.2 + len(ENCODER.encode(reqs[1].prompt)) * 2 * cost.prefill_ms_per_token / 1000


def test_a_request_waits_for_the_prefix_a_slot_is_computing_and_reuses_it() -> None:
    shared = _prompt(5, 300) + " "
    reqs = _requests([_prompt(1, 20, shared), _prompt(2, 20, shared), _prompt(3, 40)], 4)
    sim = _one_node(3, reqs, EngineCostModel())
    by = {r.rid: r for r in sim.completed}
    prefix = shared_prefix_len(ENCODER.encode(reqs[0].prompt), ENCODER.encode(reqs[1].prompt))
    assert prefix > 1000
    assert by[0].reused == 0
    assert by[1].reused == prefix  # it waited for request 0's prefill rather than computing the prefix in parallel
    assert by[2].reused == 0 and by[2].first_token is not None and by[2].first_token < by[1].first_token  # went past


def test_the_node_reports_slots_free_slots_and_the_wait_for_one() -> None:
    reports: list[Any] = []

    class Spy(Simulator):
        def _step_done(self, node: SimNode, decoding: list[Job], began: float) -> None:
            super()._step_done(node, decoding, began)
            reports.append(node.load())

    sim = Spy(SimConfig(nodes=1, slots=2, warmup=0.0, latency="0"), _requests([_prompt(i) for i in range(3)], 30), ENCODER)
    sim.run()
    assert {r.slots for r in reports} == {2}
    full = [r for r in reports if r.active_requests == 3]
    assert full and all(r.free_slots == 0 for r in full) and full[0].slot_wait_ms > 0
    assert any(r.free_slots == 1 and r.slot_wait_ms == 0 for r in reports)
    end = sim.nodes[0].load()
    assert (end.free_slots, end.slot_wait_ms, end.active_requests) == (2, 0.0, 0)
    # Its answers measured the batched decode speed, as a live engine's do.
    assert sim.nodes[0].engine.decode_ms_per_token > EngineCostModel().decode_ms_per_token


def test_slots_in_a_swarm_with_churn_complete_every_request_and_are_deterministic() -> None:
    spec = WorkloadSpec(requests=200, tokenizer="approx")
    reqs, enc, info = build_requests(spec, 4, 3)
    config = SimConfig(seed=3, slots=4, shared_cores=2, concurrency=16, churn_interval_s=10.0)
    a = Simulator(config, reqs, enc, workload=info).run()
    b = Simulator(config, reqs, enc, workload=info).run()
    assert a["requests"] == 200  # the run raises if any request did not complete
    assert a["ttft_ms"] == b["ttft_ms"] and a["hit_rate"] == b["hit_rate"] and a["churn"]["leaves"] > 0
    assert a["params"]["slots_per_node"] == 4


def test_cli_simulate_slots() -> None:
    result = CliRunner().invoke(app, ["simulate", "--nodes", "2", "--requests", "60", "--slots", "4", "--tokenizer", "approx", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["params"]["slots_per_node"] == 4
    bad = CliRunner().invoke(app, ["simulate", "--slots", "0"])
    assert bad.exit_code != 0
    with pytest.raises(ValueError):
        SimConfig(slots=0).validate()
