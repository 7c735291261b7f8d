"""A spot check scored by a third peer that holds the prompt's prefix (``/p2pinfer/check/1.0.0``),
between real node processes: the verifier holding the prefix does the prefill, the origin judges
its scores, a wrong-token peer is still caught, and a verifier that lies about its scores neither
frames an honest peer (the origin confirms a failed verdict itself) nor stays trusted.

Every answer here is a spot check (``verify_fraction`` 1, no probation, no budget), routed with
``prefer`` to the peer whose answer is checked; who verifies is the origin's own choice
(:func:`p2pinfer.core.verify.pick_verifier`): nothing forces it.
"""

from __future__ import annotations

import pytest

from p2pinfer.lab.node_process import NodeProcess, fast_config, wait_until
from p2pinfer.lab.verify_swarm import eligible, honest_answer, with_verify
from p2pinfer.lab.verify_swarm import random_tokens as tokens

pytestmark = pytest.mark.slow

SPOT_ONLY = {"fraction": 1.0, "probation_answers": 0, "budget": 1.0}


def cache_prefix(holder: NodeProcess, origin: NodeProcess, prefix: list[int]) -> None:
    holder.call("generate", tokens=prefix + tokens(999, 16), max_tokens=1, prefer="local")
    wait_until(lambda: origin.call("view")[holder.peer_id]["blocks"] >= len(prefix) // 16, 20, interval_s=0.1,
               what=f"{holder.name}'s digest at the origin")


def test_the_peer_holding_the_prefix_scores_the_spot_check_and_a_wrong_token_peer_is_still_caught() -> None:
    common = {"speed": 0.05}
    a = NodeProcess(with_verify(fast_config(**common), **SPOT_ONLY), "deleg-a")
    nodes = [a]
    try:
        b = NodeProcess(fast_config(bootstrap=(a.addr,), **common), "deleg-b")
        v = NodeProcess(fast_config(bootstrap=(a.addr,), **common), "deleg-v")
        x = NodeProcess(fast_config(bootstrap=(a.addr,), **common), "deleg-x", wrong_tokens="random")
        nodes += [b, v, x]
        wait_until(lambda: eligible(a, [b.peer_id, v.peer_id, x.peer_id]), 30, interval_s=0.1, what="a sees b, v, x")
        prefix = tokens(1, 320)
        cache_prefix(v, a, prefix)  # only v holds the prefix; a, b and x do not

        prompt = prefix + tokens(2, 16)
        honest = a.call("generate", tokens=prompt, max_tokens=12, prefer=b.peer_id, timeout_s=60)
        assert honest["served_by"] == b.peer_id and honest["attempts"][-1]["check"] == "passed", honest["attempts"]
        assert honest["token_ids"] == honest_answer(prompt, 12)
        va = a.call("status")["verification"]
        assert va["checks_delegated"] == {"passed": 1}
        assert va["tokens_checked"] == 0  # a's engine prefilled nothing for the check
        vv = v.call("status")["verification"]
        assert vv["checks_served_for_peers"] == 1
        # v restored the prefix from its cache: it evaluated the 16 new prompt tokens and the answer.
        assert vv["check_tokens_served_for_peers"] == len(prompt) - 320 + 12
        assert va["spot_check_tokens"] == vv["check_tokens_served_for_peers"]  # counted against a's budget

        bad = a.call("generate", tokens=prefix + tokens(3, 16), max_tokens=12, prefer=x.peer_id, timeout_s=60)
        last = bad["attempts"][-1]
        assert last["target"] == x.peer_id and last["check"] == "failed_after_streaming", bad["attempts"]
        status = a.call("status")
        # The verifier's verdict failed; a confirmed it on its own engine before sanctioning x. By
        # now b holds the prefix too (it served the honest request), so either v or b may have
        # scored this second check: which one depends on whose digest reached a first.
        assert status["verification"]["checks_delegated"] == {"passed": 1, "failed": 1}
        assert status["verification"]["tokens_checked"] == 320 + 16 + 12
        assert x.peer_id in status["distrusted_peers"] and v.peer_id not in status["distrusted_peers"]
        assert b.peer_id not in status["distrusted_peers"]
        served = [n.call("status")["verification"]["checks_served_for_peers"] for n in (v, b)]
        assert served[0] >= 1 and sum(served) == 2, served
    finally:
        for n in nodes:
            n.close()


def test_a_verifier_whose_scores_fail_an_honest_answer_is_distrusted_and_the_answerer_is_not() -> None:
    common = {"speed": 0.05}
    a = NodeProcess(with_verify(fast_config(**common), **SPOT_ONLY), "framer-a")
    nodes = [a]
    try:
        b = NodeProcess(fast_config(bootstrap=(a.addr,), **common), "framer-b")
        w = NodeProcess(fast_config(bootstrap=(a.addr,), **common), "framer-w", wrong_tokens="wrong-scores")
        nodes += [b, w]
        wait_until(lambda: eligible(a, [b.peer_id, w.peer_id]), 30, interval_s=0.1, what="a sees b and w")
        prefix = tokens(4, 320)
        cache_prefix(w, a, prefix)

        prompt = prefix + tokens(5, 16)
        r = a.call("generate", tokens=prompt, max_tokens=12, prefer=b.peer_id, timeout_s=60)
        assert r["served_by"] == b.peer_id and r["attempts"][-1]["check"] == "passed", r["attempts"]
        assert r["token_ids"] == honest_answer(prompt, 12)
        status = a.call("status")
        assert status["verification"]["checks_delegated"] == {"verifier_wrong": 1}
        assert w.peer_id in status["distrusted_peers"] and b.peer_id not in status["distrusted_peers"]
        assert status["counters"]["peers_distrusted"] == 1

        # w is no longer asked (nor sent requests): the next check runs on a's engine.
        before = status["verification"]["tokens_checked"]
        r = a.call("generate", tokens=prefix + tokens(6, 16), max_tokens=12, prefer=b.peer_id, timeout_s=60)
        assert r["attempts"][-1]["check"] == "passed", r["attempts"]
        status = a.call("status")
        assert status["verification"]["checks_delegated"] == {"verifier_wrong": 1}
        assert status["verification"]["tokens_checked"] > before
        assert w.call("status")["verification"]["checks_served_for_peers"] == 1
    finally:
        for n in nodes:
            n.close()


def test_probation_checks_stay_on_the_origin_even_when_a_peer_holds_the_prefix() -> None:
    """The defence against a new peer does not rest on a third one (which could collude with it):
    a colluding verifier that passes every answer is never asked for a probation check."""
    common = {"speed": 0.05}
    a = NodeProcess(with_verify(fast_config(**common), fraction=0.0, budget=1.0), "probation-a")
    nodes = [a]
    try:
        c = NodeProcess(fast_config(bootstrap=(a.addr,), **common), "probation-c", wrong_tokens="pass-scores")
        x = NodeProcess(fast_config(bootstrap=(a.addr,), **common), "probation-x", wrong_tokens="random")
        nodes += [c, x]
        wait_until(lambda: eligible(a, [c.peer_id, x.peer_id]), 30, interval_s=0.1, what="a sees c and x")
        prefix = tokens(7, 320)
        cache_prefix(c, a, prefix)
        r = a.call("generate", tokens=prefix + tokens(8, 16), max_tokens=12, prefer=x.peer_id, stream=True, timeout_s=60)
        first = r["attempts"][0]
        assert first["target"] == x.peer_id and first["check"] == "rejected", r["attempts"]
        status = a.call("status")
        assert status["verification"]["checks_delegated"] == {}
        assert x.peer_id in status["distrusted_peers"]
        assert c.call("status")["verification"]["checks_served_for_peers"] == 0
    finally:
        for n in nodes:
            n.close()
