"""The cost comparison of ``bench liar --scenario wrong-tokens`` (lab/wrong_tokens_bench.py): its
probation phase takes every origin through its probation of every peer before anything is measured,
and its cost figures are differences of /status counters around a phase."""

from __future__ import annotations

from collections import Counter

from p2pinfer.lab.wrong_tokens_bench import _probation_plan, _prompts, _verification_totals
from p2pinfer.workloads.mmlu import MMLUWorkload, load_mmlu


def test_probation_plan_sends_each_origin_its_answers_to_every_peer_for_a_subject_that_peer_holds() -> None:
    plan = _probation_plan(12, seed=2, answers=2)
    pairs = Counter((e, j) for e, j, _ in plan)
    assert pairs == Counter({(e, j): 2 for e in range(4) for j in range(4) if j != e})
    work = MMLUWorkload(load_mmlu()[:12], seed=2)
    for _, j, text in plan:
        assert text.startswith(work.header(j))  # subject j: the one node j is seeded with
    assert len({text for _, _, text in plan}) == len(plan)
    _, drawn = _prompts(12, 140, 2)
    assert not {text for _, _, text in plan} & {text for _, text in drawn}  # the later phases' prompts stay uncached


def test_verification_totals_sum_a_swarms_counters_and_its_checks_of_every_outcome() -> None:
    def status(n: int, checks: dict[str, int]) -> dict:
        keys = ("tokens_checked", "check_seconds", "spot_checks_drawn", "spot_checks_over_budget", "spot_check_tokens", "served_tokens")
        return {"verification": {**{k: n for k in keys}, "checks": checks}}

    totals = _verification_totals([status(3, {"passed": 2}), status(5, {"passed": 1, "rejected": 4})])
    assert totals["served_tokens"] == 8 and totals["spot_check_tokens"] == 8
    assert totals["checks"] == 7
