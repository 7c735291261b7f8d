"""The answer check's decision rule and spot-check policy (p2pinfer/core/verify.py), and
what a failed check does to a request's attempts."""

from __future__ import annotations

import math
import random

import pytest

from p2pinfer.core.attempts import Done, ForwardTo, Finish, Rejected, RequestAttempts, Sanction, ServeHere
from p2pinfer.core.blocks import ModelFingerprint
from p2pinfer.core.peers import Load
from p2pinfer.core.radix import RadixTree
from p2pinfer.core.router import Router
from p2pinfer.core.verify import MAX_DELEGATED_CHECK_TOKENS, SpotChecks, Verdict, VerifyConfig, checkable, judge
from p2pinfer.engines.base import GenerationParams, PositionScore

FP = ModelFingerprint("m", "t", "c", 16)


def greedy_scores(gaps: list[float]) -> list[PositionScore]:
    return [PositionScore(i, -0.1 - g, 999, -0.1, -1.0, 1.0) for i, g in enumerate(gaps)]


def test_greedy_answers_within_the_tolerance_pass_and_report_the_largest_gap() -> None:
    v = judge(greedy_scores([0.0, 0.0, 0.3, 0.0]), GenerationParams(), VerifyConfig(greedy_tolerance=0.5))
    assert v.ok and v.test == "greedy" and v.verified_tokens == 4 and v.statistic == pytest.approx(0.3)


def test_a_greedy_token_beyond_the_tolerance_fails_at_its_position() -> None:
    v = judge(greedy_scores([0.0, 0.1, 3.0, 0.0]), GenerationParams(), VerifyConfig(greedy_tolerance=0.5))
    assert not v.ok and v.verified_tokens == 2 and v.statistic == pytest.approx(3.0)
    assert "token 2" in v.reason


def sampled(n: int, logprob: float, mean: float = -2.0, var: float = 1.0) -> list[PositionScore]:
    return [PositionScore(i, logprob, 0, -0.5, mean, var) for i in range(n)]


def test_the_sampling_test_is_a_one_sided_z_test_over_the_answer() -> None:
    params = GenerationParams(temperature=0.8)
    cfg = VerifyConfig(sampling_z=6.0)
    # Exactly the expected log-likelihood: z = 0.
    assert judge(sampled(16, -2.0), params, cfg).statistic == pytest.approx(0.0)
    # Likelier than expected (top-k drops unlikely tokens): passes.
    assert judge(sampled(16, -0.5), params, cfg).ok
    # 16 tokens each 2 nats below the mean, variance 1 each: z = -32 / 4 = -8.
    v = judge(sampled(16, -4.0), params, cfg)
    assert not v.ok and v.statistic == pytest.approx(-8.0) and v.test == "sampling"
    # One bad token in 16 costs z = -2 / 4: passes.
    mixed = sampled(15, -2.0) + [PositionScore(15, -4.0, 0, -0.5, -2.0, 1.0)]
    assert judge(mixed, params, cfg).ok


def test_a_failed_sampled_answer_keeps_its_longest_passing_prefix() -> None:
    scores = sampled(8, -2.0) + sampled(8, -12.0)
    v = judge(scores, GenerationParams(temperature=1.0), VerifyConfig(sampling_z=6.0))
    assert not v.ok
    # Prefix of k good tokens then j bad ones: z = -10 j / sqrt(k + j) >= -6 holds up to j = 1 after 8.
    assert v.verified_tokens == 9
    assert -10 / math.sqrt(9) >= -6 > -20 / math.sqrt(10)


def test_grammar_and_penalised_requests_are_not_checkable() -> None:
    assert checkable(GenerationParams()) is None
    assert checkable(GenerationParams(temperature=1.0, top_k=5)) is None
    assert "grammar" in (checkable(GenerationParams(grammar='root ::= "a"')) or "")
    assert "penalties" in (checkable(GenerationParams(presence_penalty=0.5)) or "")


def test_an_empty_answer_cannot_be_judged() -> None:
    with pytest.raises(ValueError):
        judge([], GenerationParams(), VerifyConfig())


@pytest.mark.parametrize("bad", [{"fraction": -0.1}, {"fraction": 1.5}, {"probation_answers": -1}, {"probation_hold_tokens": -1}, {"greedy_tolerance": 0}, {"budget": -0.1}])
def test_bad_verify_settings_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        VerifyConfig(**bad)


def test_a_check_longer_than_the_check_protocol_carries_is_refused_while_delegating() -> None:
    """Otherwise every delegated check of a long answer would fall back to a local one, unsaid."""
    from p2pinfer.net.wire import CHECK_MAX_ANSWER_TOKENS

    assert CHECK_MAX_ANSWER_TOKENS == MAX_DELEGATED_CHECK_TOKENS
    with pytest.raises(ValueError, match="verify_delegate"):
        VerifyConfig(max_checked_tokens=MAX_DELEGATED_CHECK_TOKENS + 1)
    assert VerifyConfig(max_checked_tokens=MAX_DELEGATED_CHECK_TOKENS).delegate
    assert VerifyConfig(max_checked_tokens=4 * MAX_DELEGATED_CHECK_TOKENS, delegate=False).max_checked_tokens == 2048


def ok(n: int = 4) -> Verdict:
    return Verdict(True, n, n, "greedy", 0.0)


def bad(n: int = 4) -> Verdict:
    return Verdict(False, n, 1, "greedy", 9.0, "wrong")


def test_a_new_peer_is_held_until_it_passes_its_probation_then_spot_checked() -> None:
    checks = SpotChecks(VerifyConfig(fraction=0.25, probation_answers=2), random.Random(3))
    assert checks.plan("p") == "hold"
    checks.record("p", ok())
    assert checks.plan("p") == "hold"
    checks.record("p", ok())
    plans = [checks.plan("p") for _ in range(4000)]
    assert set(plans) == {"after", "none"}
    assert 0.22 < plans.count("after") / len(plans) < 0.28
    checks.record("p", bad())  # a failure: on probation again
    assert checks.plan("p") == "hold" and checks.failures == 1 and checks.checks == 3


def test_fraction_one_checks_everything_and_probation_zero_fraction_zero_checks_nothing() -> None:
    every = SpotChecks(VerifyConfig(fraction=1.0, probation_answers=0))
    assert all(every.plan("p") == "after" for _ in range(50))
    never = SpotChecks(VerifyConfig(fraction=0.0, probation_answers=0))
    assert all(never.plan("p") == "none" for _ in range(50))


def test_spot_checks_past_their_budget_are_skipped_until_serving_catches_up() -> None:
    checks = SpotChecks(VerifyConfig(fraction=1.0, probation_answers=0, budget=0.05))
    assert checks.plan("p") == "after"  # nothing spent yet: a check may start at the limit
    checks.note_spot_check(500)  # a cold check of a long prompt
    checks.note_served(9_000)  # 500 > 0.05 * 9000 = 450: over
    assert [checks.plan("p") for _ in range(3)] == ["none"] * 3
    assert checks.spot_checks_drawn == 4 and checks.spot_checks_over_budget == 3
    checks.note_served(1_000)  # 500 <= 0.05 * 10000
    assert checks.plan("p") == "after"


def test_probation_checks_ignore_the_budget_and_a_budget_of_one_is_no_limit() -> None:
    held = SpotChecks(VerifyConfig(fraction=1.0, probation_answers=1, budget=0.05))
    held.note_spot_check(10_000)
    assert held.plan("new peer") == "hold"
    unlimited = SpotChecks(VerifyConfig(fraction=1.0, probation_answers=0, budget=1.0))
    unlimited.note_spot_check(10_000)
    assert unlimited.plan("p") == "after" and unlimited.spot_checks_over_budget == 0


def test_spot_checks_forget_the_oldest_peer_past_the_limit() -> None:
    checks = SpotChecks(VerifyConfig(probation_answers=1, remembered_peers=2))
    for p in ("a", "b", "c"):
        checks.record(p, ok())
    assert checks.on_probation("a") and not checks.on_probation("b") and not checks.on_probation("c")


def router_with_peer(peer: str) -> Router:
    from p2pinfer.core.digest import Digest

    router = Router("me", FP, RadixTree(capacity_tokens=10_000))
    prompt = list(range(64))
    hashes = router.hasher.hashes(prompt)
    router.on_digest(Digest("full", peer, router.fingerprint_hex, 1, added=frozenset(hashes), epoch=1), 0.0)
    router.on_load(peer, Load(0, 1.0, 0), False, 0.0)
    return router


def test_a_rejected_answer_sanctions_the_peer_and_continues_from_its_verified_tokens() -> None:
    router = router_with_peer("liar")
    tokens = list(range(64)) + [5, 6]
    decision, hashes = router.route(tokens, Load(0, 1.0, 0), 0.0)
    life = RequestAttempts(router, decision, tokens, hashes, max_tokens=8, prefer="liar")
    first = life.start()[0]
    assert isinstance(first, ForwardTo) and first.peer == "liar"
    actions = life.handle(Rejected(3, "token 3 is wrong"), 1.0)
    assert isinstance(actions[0], Sanction) and actions[0].peer == "liar" and "wrong tokens" in actions[0].reason
    nxt = actions[1]
    assert isinstance(nxt, ServeHere) and nxt.resume_from == 3
    assert life.attempts[0].outcome == "WRONG_TOKENS" and life.attempts[0].generated_tokens == 3
    assert router.view.get("liar") is None  # out of the view: no traffic until heard from after its sanction
    assert life.handle(Done(0, 5), 2.0) == [Finish()]
    assert life.produced == 8


def test_a_spot_check_that_fails_after_streaming_finishes_the_request_and_sanctions() -> None:
    router = router_with_peer("liar")
    tokens = list(range(64)) + [5, 6]
    decision, hashes = router.route(tokens, Load(0, 1.0, 0), 0.0)
    life = RequestAttempts(router, decision, tokens, hashes, max_tokens=4, prefer="liar")
    life.start()
    actions = life.handle(Done(0, 4, wrong="token 0 is wrong"), 1.0)
    assert isinstance(actions[0], Sanction) and actions[-1] == Finish()
    assert life.state == "done" and life.produced == 4 and router.view.get("liar") is None


class _Candidate:
    def __init__(self, peer_id: str, wait_ms: float) -> None:
        self.peer_id = peer_id
        self.load = Load(queued_prefill_tokens=int(wait_ms), prefill_ms_per_token=1.0)


def test_a_verifier_is_a_peer_holding_more_of_the_prefix_than_this_node_then_the_least_loaded():
    from p2pinfer.core.verify import pick_verifier

    peers = {"a": _Candidate("a", 50), "b": _Candidate("b", 10), "c": _Candidate("c", 0), "x": _Candidate("x", 0)}
    matches = {"a": 20, "b": 20, "c": 5, "x": 30}
    # x answered (excluded); a and b hold 20 blocks, b waits less.
    assert pick_verifier(matches, 0, peers.get, {"x"}) == "b"
    # A peer that may not verify (busy, distrusted, on probation here) is skipped.
    assert pick_verifier(matches, 0, lambda p: None if p == "b" else peers.get(p), {"x"}) == "a"
    # Nobody holds more than this node: check here.
    assert pick_verifier(matches, 20, peers.get, {"x"}) is None
    assert pick_verifier(matches, 4, peers.get, {"x", "a", "b"}) == "c"
    assert pick_verifier({}, 0, peers.get, set()) is None


def test_restarting_probation_puts_a_peer_back_on_it():
    checks = SpotChecks(VerifyConfig(probation_answers=1))
    checks.record("v", Verdict(True, 3, 3, "greedy", 0.0))
    assert not checks.on_probation("v")
    checks.restart_probation("v")
    assert checks.on_probation("v") and checks.plan("v") == "hold"
