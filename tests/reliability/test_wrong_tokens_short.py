"""A real node process that returns wrong tokens is caught by the origin's check, distrusted,
and receives no more traffic; honest peers are never accused (p2pinfer/core/verify.py).

The wrong-token node is the lab's (:mod:`p2pinfer.lab.wrong_tokens`): its engine, cache,
fingerprint and reported reuse are honest, its answers are not. It holds the prompts'
prefix, so the origin's policy sends it the requests: nothing here forces the route.
"""

from __future__ import annotations

import pytest

from p2pinfer.lab.node_process import NodeProcess, fast_config, wait_until
from p2pinfer.lab.verify_swarm import eligible, honest_answer, with_verify
from p2pinfer.lab.verify_swarm import random_tokens as tokens
from p2pinfer.net.sanctions import PUBLISH_THRESHOLD

pytestmark = pytest.mark.slow


def test_a_wrong_token_node_is_caught_on_its_first_answer_and_gets_no_more_traffic() -> None:
    common = {"speed": 0.05}
    a = NodeProcess(with_verify(fast_config(**common), fraction=0.1), "verify-a")
    nodes = [a]
    try:
        b = NodeProcess(with_verify(fast_config(bootstrap=(a.addr,), **common), fraction=0.1), "verify-b")
        nodes.append(b)
        x = NodeProcess(fast_config(bootstrap=(a.addr,), **common), "verify-x", wrong_tokens="random")
        nodes.append(x)
        wait_until(lambda: eligible(a, [b.peer_id, x.peer_id]), 30, interval_s=0.1, what="a sees b and x")
        prefix = tokens(1, 320)
        x.call("generate", tokens=prefix + tokens(2, 16), max_tokens=1, prefer="local")  # x caches the prefix
        wait_until(lambda: a.call("view")[x.peer_id]["blocks"] >= 320 // 16, 20, interval_s=0.1, what="x's digest at a")

        prompt = prefix + tokens(3, 16)
        result = a.call("generate", tokens=prompt, max_tokens=12, stream=True, timeout_s=60)
        first = result["attempts"][0]
        assert first["target"] == x.peer_id and first["outcome"] == "WRONG_TOKENS" and first["check"] == "rejected"
        assert result["served_by"] != x.peer_id
        # The wrong tokens were held back: the client got the honest answer, continued elsewhere.
        assert result["token_ids"] == honest_answer(prompt, 12)
        status = a.call("status")
        assert x.peer_id in status["distrusted_peers"]
        assert status["verification"]["checks"].get("rejected") == 1
        assert status["counters"]["peers_distrusted"] == 1

        served_before = x.call("status")["counters"]["forwards_served"]
        for i in range(8):  # x still holds and advertises the prefix; nothing more reaches it
            r = a.call("generate", tokens=prefix + tokens(10 + i, 16), max_tokens=4, timeout_s=60)
            assert all(att["target"] != x.peer_id for att in r["attempts"]), r["attempts"]
        assert x.call("status")["counters"]["forwards_served"] == served_before
        assert a.call("status")["gossip_scores"][x.peer_id] < -PUBLISH_THRESHOLD
        assert b.peer_id not in a.call("status")["distrusted_peers"]
    finally:
        for n in nodes:
            n.close()


def test_a_probation_answer_streams_once_its_window_passes_and_a_late_liar_is_caught_at_its_end() -> None:
    """The first ``probation_hold_tokens`` (16) tokens of a probation answer are held and checked,
    then the rest streams and the whole answer is checked at its end. An honest peer's long answer
    is held for 16 tokens only; a liar honest for its first 24 tokens passes the window, and its
    end check distrusts it (what it streamed after the window, the client saw: docs/security.md)."""
    common = {"speed": 0.05}
    a = NodeProcess(with_verify(fast_config(**common), fraction=0.1), "window-a")
    nodes = [a]
    try:
        b = NodeProcess(fast_config(bootstrap=(a.addr,), **common), "window-b")
        nodes.append(b)
        x = NodeProcess(fast_config(bootstrap=(a.addr,), **common), "window-x", wrong_tokens="late")
        nodes.append(x)
        wait_until(lambda: eligible(a, [b.peer_id, x.peer_id]), 30, interval_s=0.1, what="a sees b and x")
        honest = a.call("generate", tokens=tokens(4, 64), max_tokens=40, prefer=b.peer_id, stream=True, timeout_s=60)
        last = honest["attempts"][-1]
        assert honest["served_by"] == b.peer_id and last["check"] == "passed" and last["held_tokens"] == 16, honest["attempts"]
        assert honest["token_ids"] == honest_answer(tokens(4, 64), 40)

        prefix = tokens(1, 320)
        x.call("generate", tokens=prefix + tokens(2, 16), max_tokens=1, prefer="local")  # x caches the prefix
        wait_until(lambda: a.call("view")[x.peer_id]["blocks"] >= 320 // 16, 20, interval_s=0.1, what="x's digest at a")
        prompt = prefix + tokens(3, 16)
        result = a.call("generate", tokens=prompt, max_tokens=40, stream=True, timeout_s=60)
        first = result["attempts"][0]
        assert first["target"] == x.peer_id and first["held_tokens"] == 16, result["attempts"]
        assert first["check"] == "failed_after_streaming", result["attempts"]
        right = honest_answer(prompt, 40)
        assert result["token_ids"][:24] == right[:24] and result["token_ids"][24:] != right[24:]
        status = a.call("status")
        assert x.peer_id in status["distrusted_peers"]
        assert status["verification"]["checks"] == {"passed": 1, "failed_after_streaming": 1}
        assert status["verification"]["probation_windows_passed"] == 2
        r = a.call("generate", tokens=prefix + tokens(5, 16), max_tokens=4, timeout_s=60)
        assert all(att["target"] != x.peer_id for att in r["attempts"]), r["attempts"]
    finally:
        for n in nodes:
            n.close()


def test_spot_checks_keep_to_their_budget_of_the_nodes_own_work() -> None:
    """``verify_budget``: a spot check drawn while the checks' evaluated tokens exceed the budget's
    share of the tokens this node's engine evaluated serving is skipped, and runs again once the
    node has served enough (every answer is drawn: fraction 1, no probation)."""
    common = {"speed": 0.05}
    a = NodeProcess(with_verify(fast_config(**common), fraction=1.0, probation_answers=0, budget=0.05), "budget-a")
    nodes = [a]
    try:
        b = NodeProcess(fast_config(bootstrap=(a.addr,), **common), "budget-b")
        nodes.append(b)
        wait_until(lambda: eligible(a, [b.peer_id]), 30, interval_s=0.1, what="a sees b")
        forwarded = [a.call("generate", tokens=tokens(20 + i, 64), max_tokens=8, prefer=b.peer_id, timeout_s=60) for i in range(3)]
        assert [r["served_by"] for r in forwarded] == [b.peer_id] * 3
        # The first check starts at the limit (nothing spent, nothing served); the next two are over it.
        assert [r["attempts"][-1]["check"] for r in forwarded] == ["passed", "", ""]
        v = a.call("status")["verification"]
        assert (v["spot_checks_drawn"], v["spot_checks_over_budget"], v["served_tokens"]) == (3, 2, 0)
        assert v["spot_check_tokens"] == 64 + 8  # a cold check: the whole prompt and the answer
        served = 0
        i = 0
        while served * 0.05 < v["spot_check_tokens"]:  # serve here until the budget covers the check
            r = a.call("generate", tokens=tokens(40 + i, 300), max_tokens=8, prefer="local", timeout_s=60)
            served += r["prompt_tokens"] - r["reused_tokens"] + r["generated_tokens"]
            i += 1
        assert a.call("status")["verification"]["served_tokens"] == served
        r = a.call("generate", tokens=tokens(60, 64), max_tokens=8, prefer=b.peer_id, timeout_s=60)
        assert r["served_by"] == b.peer_id and r["attempts"][-1]["check"] == "passed", r["attempts"]
        v = a.call("status")["verification"]
        assert (v["spot_checks_drawn"], v["spot_checks_over_budget"]) == (4, 2)
    finally:
        for n in nodes:
            n.close()


def test_honest_llama_cpp_peers_with_other_thread_counts_pass_every_check() -> None:
    """Real SmolLM2 on both sides, the origin at 1 thread and batch 32, the peer at 2 threads and
    batch 128 with flash attention: every answer is checked (fraction 1, no budget) and none is rejected."""
    a_opts = {"threads": 1, "batch_size": 32, "context_size": 2048, "cache_tokens": 4096}
    b_opts = {"threads": 2, "batch_size": 128, "flash_attn": True, "context_size": 2048, "cache_tokens": 4096}
    a = NodeProcess(with_verify(fast_config().replace(engine="llama-cpp", engine_options=a_opts), fraction=1.0, budget=1.0), "honest-a",
                    start_timeout_s=120)
    nodes = [a]
    try:
        b = NodeProcess(fast_config(bootstrap=(a.addr,)).replace(engine="llama-cpp", engine_options=b_opts), "honest-b",
                        start_timeout_s=120)
        nodes.append(b)
        wait_until(lambda: eligible(a, [b.peer_id]), 60, interval_s=0.2, what="a sees b")
        texts = [
            "The capital of France is",
            "Once upon a time, in a small village by the sea, there lived",
            "1, 2, 3, 4, 5, 6,",
            "The following are multiple choice questions (with answers) about astronomy.\n\n"
            "What is the closest planet to the Sun?\nA. Venus\nB. Mercury\nC. Mars\nD. Earth\nAnswer: B. Mercury\n\n"
            "Which planet has the most moons?\nA.",
        ]
        checked = 0
        for i, text in enumerate(texts * 2):
            params = {"max_tokens": 12}
            if i >= len(texts):  # sampled answers too: the log-likelihood test
                params.update(temperature=0.9, seed=i)
            r = a.call("generate", prompt=text, prefer=b.peer_id, timeout_s=120, **params)
            assert r["served_by"] == b.peer_id, r["attempts"]
            assert r["generated_tokens"] > 0, r  # every prompt here has an answer to check
            assert r["attempts"][-1]["check"] == "passed", r["attempts"]
            checked += 1
        status = a.call("status")
        assert status["verification"]["checks"] == {"passed": checked}
        assert status["distrusted_peers"] == {} and status["counters"]["peers_distrusted"] == 0
        assert status["verification"]["tokens_checked"] > 0
    finally:
        for n in nodes:
            n.close()


def test_a_peers_text_is_never_shown_the_origin_renders_the_checked_token_ids_itself() -> None:
    """A peer that returns the honest token ids with other text beside them passes every check
    (checks judge ids): the client still gets the text of those ids, rendered by the origin."""
    common = {"speed": 0.05}
    a = NodeProcess(with_verify(fast_config(**common), fraction=1.0), "text-a")
    nodes = [a]
    try:
        x = NodeProcess(fast_config(bootstrap=(a.addr,), **common), "text-x", wrong_tokens="wrong-text")
        nodes.append(x)
        wait_until(lambda: eligible(a, [x.peer_id]), 30, interval_s=0.1, what="a sees x")
        prompt = tokens(6, 64)
        result = a.call("generate", tokens=prompt, max_tokens=24, prefer=x.peer_id, stream=True, timeout_s=60)
        assert result["served_by"] == x.peer_id and result["attempts"][-1]["check"] == "passed", result["attempts"]
        right = honest_answer(prompt, 24)
        assert result["token_ids"] == right
        # x's own text for these ids is WRONG_TEXT; a's tokenizer renders each unknown id as <id>.
        local = a.call("generate", tokens=prompt, max_tokens=24, prefer="local", timeout_s=60)
        assert local["token_ids"] == right and result["text"] == local["text"]
        assert "[text the tokens do not say]" not in result["text"] and result["text"]
        assert x.peer_id not in a.call("status")["distrusted_peers"]
    finally:
        for n in nodes:
            n.close()
