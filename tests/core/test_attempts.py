"""The request lifecycle (p2pinfer/core/attempts.py): its rules, event by event."""

from __future__ import annotations

from dataclasses import replace

import pytest

from p2pinfer.core import LOCAL, Load, ModelFingerprint, RadixTree, Router, RouterConfig
from p2pinfer.core.attempts import (
    DeadlinePassed,
    Done,
    Fail,
    Finish,
    ForwardTo,
    PeerLost,
    Refused,
    RequestAttempts,
    Sanction,
    ServeHere,
    StoppedAtEntry,
)
from p2pinfer.core.policies import Candidate, Decision

FP = ModelFingerprint("m", "t", "c")
PROMPT = list(range(1, 16 * 8 + 1))
PEERS = ["p1", "p2", "p3", "p4"]


def router(**config: object) -> Router:
    r = Router("me", FP, RadixTree(), config=RouterConfig(**config), seed=1)  # type: ignore[arg-type]
    for p in PEERS:
        r.on_load(p, Load(0, 4.0), False, 0.0)
    return r


def decision(order: list[str], predicted: int = 64) -> Decision:
    cands = tuple(Candidate(t, 0 if t == LOCAL else predicted, 1.0) for t in order)
    return Decision("test", cands[0].target, cands[0].predicted_match_tokens, "test", cands)


def test_fallbacks_in_rank_order_then_local_after_max_attempts_peers() -> None:
    r = router()
    life = RequestAttempts(r, decision([*PEERS, LOCAL]), PROMPT)
    assert life.start() == [ForwardTo("p1", 64)]
    assert life.handle(Refused("BUSY"), 1.0) == [ForwardTo("p2", 64)]
    assert life.handle(PeerLost("reset"), 1.0) == [ForwardTo("p3", 64)]
    # A third peer refused: max_attempts (3) peers tried, so this node serves it.
    assert life.handle(Refused("BUSY"), 1.0) == [ServeHere(0)]
    assert life.handle(Done(0), 1.0) == [Finish()]
    assert [a.outcome for a in life.attempts] == ["BUSY", "failed", "BUSY", "done"]
    # BUSY backs a peer off; a lost peer leaves the view until heard from again.
    assert r.view.get("p1").backing_off(1.5) and "p2" not in r.view and r.view.get("p3").backing_off(1.5)  # type: ignore[union-attr]


def test_local_at_its_rank_and_a_full_local_queue_falls_through_to_peers() -> None:
    life = RequestAttempts(router(max_attempts=1), decision(["p1", LOCAL, "p2", "p3"]), PROMPT)
    assert life.start() == [ForwardTo("p1", 64)]
    assert life.handle(Refused("BUSY"), 1.0) == [ServeHere(0)]
    # Our own engine's queue is full: the next peers, within the limit (none left).
    assert life.handle(Refused("BUSY", "queue full"), 1.0) == [
        Fail("exhausted", "no candidate could serve the request (p1: BUSY; me: BUSY queue full)")
    ]


def test_a_lost_forward_resumes_from_the_tokens_produced_and_ends_when_all_are_out() -> None:
    life = RequestAttempts(router(), decision(["p1", "p2", LOCAL]), PROMPT, max_tokens=10)
    life.start()
    assert life.handle(PeerLost("stall", generated=4), 1.0) == [ForwardTo("p2", 64, resume_from=4)]
    assert life.handle(PeerLost("reset", generated=6), 1.0) == [Finish(record_missing=True)]
    assert life.produced == 10 and [a.resumed_tokens for a in life.attempts] == [0, 4]


def test_overclaiming_peer_is_sanctioned_after_its_trust_falls() -> None:
    r = router()
    actions = []
    for _ in range(3):
        life = RequestAttempts(r, decision(["p1", LOCAL], predicted=128), PROMPT)
        life.start()
        actions.append(life.handle(Done(reused_tokens=0), 1.0))
        if "p1" not in r.view:
            break
    assert actions[0] == [Finish()]
    assert actions[-1] == [Sanction("p1", "it advertised 128 cached prompt tokens and reused 0"), Finish()]
    assert "p1" not in r.view  # the edge keeps it out for distrust_s


def test_a_shortfall_at_a_holder_a_directory_owner_vouched_for_counts_against_the_owner_too() -> None:
    """An owner (p4) that names p1 and p2 in turn, neither holding anything: two
    lies sanction the owner, while each named peer, wronged once, keeps its trust."""
    r = router()
    actions = []
    for holder in ("p1", "p2"):
        d = replace(decision([holder, LOCAL], predicted=128), vouched_by=((holder, "p4"),))
        life = RequestAttempts(r, d, PROMPT)
        life.start()
        actions.append(life.handle(Done(reused_tokens=0), 1.0))
    assert actions[0] == [Finish()]
    assert actions[1] == [Sanction("p4", "its directory answer gave p2 128 cached prompt tokens and it reused 0"), Finish()]
    assert "p4" not in r.view and "p1" in r.view and "p2" in r.view
    assert r.view.get("p1").trust == r.view.get("p2").trust == 0.7  # type: ignore[union-attr]


def test_a_resumed_forward_says_nothing_about_trust() -> None:
    r = router()
    for _ in range(4):
        life = RequestAttempts(r, decision(["p2", "p1", LOCAL], predicted=128), PROMPT, max_tokens=8)
        life.start()
        life.handle(PeerLost(generated=2), 1.0)
        assert life.handle(Done(0, 6), 1.0) == [Finish()]
        r.on_load("p2", Load(0, 4.0), False, 1.0)
    assert r.view.get("p1").trust == 1.0  # type: ignore[union-attr]


def test_a_stop_found_at_the_entry_finishes_the_request_and_judges_no_reuse() -> None:
    """The try ended at a stop string its engine went past: done, the record missing,
    and the peer's trust untouched (its reuse was never reported), even unresumed."""
    r = router()
    for _ in range(4):
        life = RequestAttempts(r, decision(["p1", LOCAL], predicted=128), PROMPT, max_tokens=50)
        life.start()
        assert life.handle(StoppedAtEntry(generated=7), 1.0) == [Finish(record_missing=True)]
        assert life.state == "done" and life.produced == 7 and life.current.outcome == "done"
    assert r.view.get("p1").trust == 1.0  # type: ignore[union-attr]


def test_prefer_goes_first_deadline_fails_and_events_after_the_end_are_refused() -> None:
    life = RequestAttempts(router(), decision(["p1", LOCAL]), PROMPT, prefer="p3")
    assert life.start() == [ForwardTo("p3", 0)]
    assert life.handle(DeadlinePassed("2 s"), 1.0) == [Fail("deadline", "request not done within its deadline: 2 s")]
    with pytest.raises(RuntimeError):
        life.handle(Done(0), 1.0)
    assert RequestAttempts(router(), decision(["p1", LOCAL]), PROMPT, prefer="me").start() == [ServeHere(0)]


def test_model_mismatch_drops_the_peer_and_other_refusals_only_move_on() -> None:
    r = router()
    life = RequestAttempts(r, decision(["p1", "p2", "p3", LOCAL]), PROMPT)
    life.start()
    assert life.handle(Refused("MODEL_MISMATCH"), 1.0) == [ForwardTo("p2", 64)]
    assert life.handle(Refused("INTERNAL"), 1.0) == [ForwardTo("p3", 64)]
    assert "p1" not in r.view and not r.view.get("p2").backing_off(1.5)  # type: ignore[union-attr]
