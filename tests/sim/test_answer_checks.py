"""Answer checks in the simulator (p2pinfer/sim/answer_checks.py): what probation costs a forwarded TTFT.

Two nodes, one prompt: node 0 serves it first and caches it; three later
requests enter node 1, which forwards them to node 0 (the prefix holder). With
the node default's checks node 1 holds node 0's first two answers
(``probation_answers``) until its own engine has checked them; the expected
delays follow from the cost model, so the test holds at any calibration.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from p2pinfer.core.costmodel import EngineCostModel
from p2pinfer.core.verify import VerifyConfig
from p2pinfer.sim.model import Req
from p2pinfer.sim.simulator import SimConfig, Simulator
from p2pinfer.workloads import PromptEncoder, load_tokenizer
from p2pinfer.workloads.base import Prompt, TimedRequest

ENCODER = PromptEncoder(load_tokenizer("approx"))
PROMPT = " ".join(f"word{j} thing{j}" for j in range(80))
COST = EngineCostModel()


def _requests(output_tokens: int) -> list[TimedRequest]:
    first = TimedRequest(0.0, Prompt("r0", (PROMPT,), output_tokens=output_tokens), entry=0)
    later = [TimedRequest(10.0 * i, Prompt(f"r{i}", (PROMPT,), output_tokens=output_tokens), entry=1) for i in (1, 2, 3)]
    return [first, *later]


def _run(output_tokens: int, verify: VerifyConfig | None, check_cache: bool = False) -> tuple[Simulator, list[Req]]:
    config = SimConfig(nodes=2, latency="1", warmup=0.0, instant_gossip=True, cost=COST, verify=verify, check_cache=check_cache)
    sim = Simulator(config, _requests(output_tokens), ENCODER)
    sim.run()
    return sim, sorted(sim.completed, key=lambda r: r.rid)


def _ttft_ms(r: Req) -> float:
    assert r.first_token is not None
    return (r.first_token - r.arrival) * 1000.0


def test_a_new_peers_first_answers_are_held_until_the_entry_checked_them() -> None:
    output = 4  # shorter than the probation window: held whole, one check each
    bare_sim, bare = _run(output, None)
    sim, got = _run(output, VerifyConfig())
    assert [r.served_by.idx for r in got] == [0, 0, 0, 0] == [r.served_by.idx for r in bare]  # type: ignore[union-attr]
    assert [r.check for r in got] == ["none", "hold", "hold", "none"]  # probation_answers = 2, then trusted
    prompt = bare[1].n_tokens
    # Held: the rest of the answer, then the entry's check of prompt + answer (its cache has none of it).
    delay = COST.decode_ms(output) + COST.prefill_ms(prompt + output, 0)
    for i in (1, 2):
        assert _ttft_ms(got[i]) == pytest.approx(_ttft_ms(bare[i]) + delay, abs=1e-6)
    assert _ttft_ms(got[3]) == pytest.approx(_ttft_ms(bare[3]), abs=1e-6)
    assert _ttft_ms(got[0]) == _ttft_ms(bare[0])  # served where it entered: nothing to check
    assert sim.check_stats["checked_hold"] == 2 and sim.check_stats["check_tokens"] == 2 * (prompt + output)
    assert sim.nodes[1].checks is not None and sim.nodes[1].checks.passed(sim.nodes[0].id) == 2
    assert bare_sim.check_stats == {}


def test_a_long_answer_is_released_after_its_window_is_checked() -> None:
    verify = VerifyConfig()
    window = verify.probation_hold_tokens
    output = 3 * window
    _, bare = _run(output, None)
    sim, got = _run(output, verify)
    prompt = bare[1].n_tokens
    delay = COST.decode_ms(window) + COST.prefill_ms(prompt + window, 0)
    for i in (1, 2):
        assert _ttft_ms(got[i]) == pytest.approx(_ttft_ms(bare[i]) + delay, abs=1e-6)
    # Each held answer: its window checked, then the whole answer at its end.
    assert sim.check_stats["windows"] == 2 and sim.check_stats["checked_hold"] == 2
    assert sim.check_stats["check_tokens"] == 2 * (prompt + window) + 2 * (prompt + output)


def test_check_cache_leaves_the_checked_prompt_at_the_entry() -> None:
    _, got = _run(4, VerifyConfig(), check_cache=True)
    # r1's check cached the prompt at node 1, so r2 and r3 are served where they entered.
    assert [r.served_by.idx for r in got] == [0, 0, 1, 1]  # type: ignore[union-attr]
    assert [r.check for r in got] == ["none", "hold", "none", "none"]


def test_spot_checks_cost_the_entrys_engine_not_the_clients_ttft() -> None:
    every = VerifyConfig(fraction=1.0, probation_answers=0, budget=1.0)
    bare_sim, bare = _run(4, None)
    sim, got = _run(4, every)
    assert [r.check for r in got] == ["none", "after", "after", "after"]
    assert [_ttft_ms(r) for r in got] == pytest.approx([_ttft_ms(r) for r in bare], abs=1e-6)
    assert sim.check_stats["checked_after"] == 3
    assert sim.nodes[1].busy_s > bare_sim.nodes[1].busy_s == 0.0


def test_checks_turned_off_reproduce_the_simulator_without_them(mmlu_300) -> None:  # type: ignore[no-untyped-def]
    spec, (reqs, encoder, info) = mmlu_300
    base = SimConfig(nodes=4, seed=7)
    plain = Simulator(base, reqs, encoder, workload=info).run()
    off = Simulator(replace(base, verify=VerifyConfig(fraction=0.0, probation_answers=0)), reqs, encoder, workload=info).run()
    assert (off["ttft_ms"], off["hit_rate"], off["sim"]["events"]) == (plain["ttft_ms"], plain["hit_rate"], plain["sim"]["events"])
    assert plain["answer_checks"] is None and off["answer_checks"]["forwarded_held"] == 0


def test_checks_are_modelled_on_one_slot_only() -> None:
    with pytest.raises(ValueError, match="one slot"):
        SimConfig(slots=2, verify=VerifyConfig()).validate()


def test_every_request_completes_with_checks_under_churn(mmlu_300) -> None:  # type: ignore[no-untyped-def]
    """Entries and peers die mid-check: held requests are retried, none is left waiting for a check."""
    spec, (reqs, encoder, info) = mmlu_300
    reqs = [replace(r, prompt=replace(r.prompt, output_tokens=8)) for r in reqs]  # windows of 2 tokens, then more
    config = SimConfig(nodes=4, seed=7, churn_interval_s=10.0,
                       verify=VerifyConfig(fraction=0.5, probation_answers=1, probation_hold_tokens=2, budget=1.0))
    out = Simulator(config, reqs, encoder, workload=info).run()  # raises when a request never completes
    assert out["requests"] == len(reqs) and out["churn"]["leaves"] > 0
    counts = out["answer_checks"]["counts"]
    assert counts["checked_hold"] > 0 and counts["windows"] > 0 and counts["checked_after"] > 0


def test_simulate_cli_models_checks_with_verify_and_refuses_them_with_slots() -> None:
    import json

    from typer.testing import CliRunner

    from p2pinfer.cli.main import app

    runner = CliRunner()
    args = ["simulate", "--nodes", "4", "--requests", "60", "--tokenizer", "approx", "--json"]
    plain = runner.invoke(app, args)
    checked = runner.invoke(app, [*args, "--verify"])
    assert plain.exit_code == 0 and checked.exit_code == 0, (plain.output, checked.output)
    assert json.loads(plain.stdout)["answer_checks"] is None
    got = json.loads(checked.stdout)["answer_checks"]
    assert got["config"] == {**got["config"], "probation_answers": 2, "fraction": 0.1} and got["counts"]["checked_hold"] > 0
    refused = runner.invoke(app, [*args, "--verify", "--slots", "2"])
    assert refused.exit_code != 0 and "one slot" in refused.output
