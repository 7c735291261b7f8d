"""The engines' queue model: what a FIFO engine will have cached when a queued request starts."""

from __future__ import annotations

from hypothesis import given, strategies as st
import pytest

from p2pinfer.core.engine_queue import EngineQueue, PromptsAhead, QueueFull, shared_prefix_len

tokens = st.lists(st.integers(0, 3), max_size=40)


@given(tokens, tokens)
def test_shared_prefix_len_is_the_first_mismatch(a: list[int], b: list[int]) -> None:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    assert shared_prefix_len(a, b) == n == shared_prefix_len(tuple(b), a)


def test_prompts_ahead_covers_by_the_longest_and_forgets_by_identity() -> None:
    ahead = PromptsAhead()
    one, two, same_as_two = [1, 2, 3, 4], [1, 2, 9], [1, 2, 9]
    assert ahead.covered([1, 2, 3]) == 0
    ahead.add(one)
    ahead.add(two)
    ahead.add(same_as_two)
    assert ahead.covered([1, 2, 3, 4, 5]) == 4 and ahead.covered([1, 2, 9, 9]) == 3
    ahead.remove(one)
    assert ahead.covered([1, 2, 3, 4, 5]) == 2
    ahead.remove(two)
    assert len(ahead) == 1 and ahead.covered([1, 2, 9]) == 3  # the equal one is still queued


def test_queued_prefill_counts_what_neither_cache_nor_a_prompt_ahead_covers() -> None:
    q = EngineQueue(ms_per_token=4.0, max_queue=2)
    first, second = list(range(100)), list(range(80)) + [7] * 20
    a = q.admit(first, cached=10)
    b = q.admit(second, cached=0)  # 80 tokens of it will be cached by `first`
    assert q.load().queued_prefill_tokens == 90 + 20 and q.load().active_requests == 2
    with pytest.raises(QueueFull):
        q.admit([1, 2, 3], cached=0)
    q.start(a, reused=30)  # the cache grew meanwhile: it counts at its true size
    assert q.load().queued_prefill_tokens == 70 + 20 and not q.can_start()
    q.prefilled(a, 70, ms_per_token=8.0)
    assert q.load().queued_prefill_tokens == 20 and q.ms_per_token == 0.75 * 4.0 + 0.25 * 8.0
    q.finish(a)
    q.finish(a)  # idempotent
    assert q.can_start() and q.load().active_requests == 1
    q.finish(b)  # cancelled before it started
    assert (q.load().queued_prefill_tokens, q.load().active_requests, q.running) == (0, 0, 0)


def test_a_guessed_speed_is_replaced_by_the_first_timed_prefill_and_short_ones_are_not_timed() -> None:
    q = EngineQueue(ms_per_token=4.35, speed_measured=False, max_reuse=lambda n: n - 2)
    t = q.admit(list(range(20)), cached=20)
    assert t.estimate == 2  # the engine evaluates the last two tokens itself
    q.start(t, 18)
    q.prefilled(t, 15, ms_per_token=1.0)
    assert q.ms_per_token == 4.35  # 15 tokens: fixed costs dominate
    assert not q.load().speed_measured  # its load report says the speed is the prior
    t2 = q.admit(list(range(50)), cached=0)
    q.start(t2, 0)
    q.prefilled(t2, 50, ms_per_token=2.0)
    assert q.ms_per_token == 2.0 and q.speed_measured
    assert q.load().speed_measured and q.load().prefill_ms_per_token == 2.0


def test_slots_bound_what_runs_at_once() -> None:
    q = EngineQueue(ms_per_token=1.0, slots=2)
    tickets = [q.admit([i] * 20, cached=0) for i in range(3)]
    q.start(tickets[0], 0)
    assert q.can_start()
    q.start(tickets[1], 0)
    assert not q.can_start() and q.running == 2
    q.finish(tickets[0])
    assert q.can_start()


def test_free_slots_and_the_wait_for_one_follow_the_answers_being_decoded() -> None:
    """Two slots, decode at 10 ms per token: answers of 100 and 300 tokens
    end 1 s and 3 s after their prefill; a third request waits for the first
    slot to free and holds it for its own 200 tokens, so a fourth arriving
    at t=0 waits for the second slot (3 s)."""
    q = EngineQueue(ms_per_token=1.0, slots=2, decode_ms_per_token=10.0)
    assert q.load(0.0).free_slots == 2
    a = q.admit([1] * 20, cached=0, max_tokens=100)
    b = q.admit([2] * 20, cached=0, max_tokens=300)
    assert q.load(0.0).free_slots == 0 and q.load(0.0).slot_wait_ms > 0  # both in prefill, none free
    for t in (a, b):
        q.start(t, 0)
        q.prefilled(t, 20, now=0.0)
    load = q.load(0.0)
    assert (load.slots, load.free_slots, load.slot_wait_ms) == (2, 0, 1000.0)
    assert load.wait_ms() == 1000.0  # more than the prefill queued (none)
    assert q.load(0.4).slot_wait_ms == pytest.approx(600.0)  # the answers are under way
    assert q.load().slot_wait_ms == 0.0  # no clock given: not estimated
    c = q.admit([3] * 20, cached=0, max_tokens=200)
    assert q.load(0.0).slot_wait_ms == pytest.approx(3000.0)  # c takes a's slot at 1 s and holds it until 3.02 s
    q.finish(a)
    q.start(c, 0)
    assert q.load(1.0).free_slots == 0
    q.finish(b)
    load = q.load(3.0)
    assert (load.free_slots, load.slot_wait_ms) == (1, 0.0)
    q.finish(c)


def test_without_a_decode_speed_the_wait_for_a_slot_is_not_estimated() -> None:
    q = EngineQueue(ms_per_token=1.0, slots=1)
    t = q.admit([1] * 20, cached=0, max_tokens=500)
    q.start(t, 0)
    q.prefilled(t, 20, now=0.0)
    assert q.load(0.0).slot_wait_ms == 0.0
    q.decode_measured(20.0)
    assert q.decode_ms_per_token == 20.0
    q.decode_measured(40.0)
    assert q.decode_ms_per_token == pytest.approx(25.0)  # EWMA, weight 0.25
    q.finish(t)
    assert q.load(0.0).free_slots == 1


def test_a_reply_being_saved_counts_as_queued_prefill_and_holds_its_slot() -> None:
    """One slot, 2 ms per prefill token: an answer that ends early and evaluates
    its 150-token reply again for the cache is 150 tokens (300 ms) of queued
    prefill, and its slot frees when that is done, until it finishes."""
    q = EngineQueue(ms_per_token=2.0, slots=1, decode_ms_per_token=10.0)
    t = q.admit([1] * 20, cached=0, max_tokens=500)
    q.start(t, 0)
    q.prefilled(t, 20, now=0.0)
    assert q.load(0.0).queued_prefill_tokens == 0 and q.load(0.0).slot_wait_ms == 5000.0  # 500 tokens at 10 ms
    q.saving_reply(t, [7] * 150, now=1.0)  # its answer ended at 1 s
    load = q.load(1.0)
    assert (load.queued_prefill_tokens, load.free_slots, load.slot_wait_ms) == (150, 0, pytest.approx(300.0))
    assert load.wait_ms() == pytest.approx(300.0)
    q.finish(t)
    assert (q.load(1.3).queued_prefill_tokens, q.load(1.3).free_slots) == (0, 1)
    q.saving_reply(t, [7] * 150, now=1.3)  # after finish (a late event): ignored
    assert q.load(1.3).queued_prefill_tokens == 0


def test_a_next_turn_arriving_while_the_reply_is_saved_counts_only_what_goes_past_prompt_and_reply() -> None:
    """The next turn (prompt + reply + its own message) arrives while the
    previous answer's reply is saved: the engine makes it wait for the save
    and it then restores prompt and reply, so its own estimate is its new
    message only, while the load still counts the save's tokens ahead of it."""
    q = EngineQueue(ms_per_token=2.0, slots=2, decode_ms_per_token=10.0)
    prompt, reply = list(range(100)), list(range(1000, 1064))
    t = q.admit(prompt, cached=0, max_tokens=64)
    q.start(t, 0)
    q.prefilled(t, 100, now=0.0)
    q.saving_reply(t, reply, now=1.0)
    assert q.load(1.0).queued_prefill_tokens == 64  # what the save has to evaluate
    nxt = q.admit(prompt + reply + [5] * 30, cached=100, max_tokens=16)
    assert nxt.estimate == 30  # only its own message: prompt and reply will be cached
    load = q.load(1.0)
    assert load.queued_prefill_tokens == 64 + 30 and load.wait_ms() == pytest.approx(2.0 * 94)
    q.finish(t)
    assert q.load(1.2).queued_prefill_tokens == 30 and len(q.ahead) == 1


def test_a_check_is_background_work_it_holds_a_slot_but_is_not_in_the_queued_prefill_a_request_waits_for() -> None:
    q = EngineQueue(ms_per_token=2.0, slots=2, decode_ms_per_token=10.0)
    prompt = list(range(100))
    check = q.admit(prompt + [5, 6, 7], cached=40, background=True)
    assert check.estimate == 63 and q.background_queued == 63
    load = q.load(now=0.0)
    assert load.queued_prefill_tokens == 0 and load.wait_ms() == 0.0  # what the cost policy compares
    assert (load.active_requests, load.free_slots) == (1, 1)  # but it takes a slot: the load shows it
    req = q.admit(prompt + [9], cached=0, max_tokens=4)
    assert req.estimate == 101  # a check caches nothing: it is no prompt ahead
    assert q.load(now=0.0).queued_prefill_tokens == 101 and q.background_queued == 63
    q.start(check, reused=50)
    assert q.background_queued == 53 and q.queued == 101
    q.reuse(check, 0)  # its restore failed
    assert q.background_queued == 103
    q.start(req, reused=0)
    assert not q.can_start() and q.load(now=0.0).slot_wait_ms > 0  # both slots are taken
    q.prefilled(check, 103, ms_per_token=1.0)
    assert q.background_queued == 0 and q.ms_per_token == 0.75 * 2.0 + 0.25 * 1.0
    q.finish(check)
    q.finish(check)
    assert (q.active, q.running, q.background_queued, q.queued) == (1, 1, 0, 101)
    q.finish(req)
    assert (q.active, q.running, q.queued, len(q.ahead)) == (0, 0, 0, 0)


def test_check_turns_let_requests_go_first_and_never_starve_a_check() -> None:
    from p2pinfer.core.engine_queue import CheckTurns

    turns = CheckTurns(every=4)
    assert turns.next(False, False) is None
    assert turns.next(True, False) == "request" and turns.passed == 0  # no check waiting: nothing passed over
    assert turns.next(False, True) == "check"
    picks = [turns.next(True, True) for _ in range(12)]
    assert picks == ["request", "request", "request", "check"] * 3  # a check every 4th turn at least
    assert [turns.next(False, True) for _ in range(3)] == ["check"] * 3  # all turns when no request prefills
    with pytest.raises(ValueError):
        CheckTurns(every=0)


def test_waits_for_prefix_is_the_shared_admission_rule() -> None:
    from p2pinfer.core.engine_queue import waits_for_prefix

    prompt = list(range(100))
    in_prefill = list(range(80)) + [999]
    # Work ahead will cache 80 tokens of it, the cache holds none: one block (16) more or better: wait.
    assert waits_for_prefix(prompt, 0, [in_prefill], 16)
    # The cache already holds 70: the work ahead adds less than a block: go.
    assert not waits_for_prefix(prompt, 70, [in_prefill], 16)
    assert waits_for_prefix(prompt, 64, [in_prefill], 16)
    # Nothing ahead shares its prefix: go.
    assert not waits_for_prefix(prompt, 0, [[5, 6, 7]], 16)
    assert not waits_for_prefix(prompt, 0, [], 16)
    # What it may reuse caps what the work ahead brings.
    assert not waits_for_prefix(prompt, 0, [in_prefill], 16, max_reuse=10)
