"""Killing a serving node, through the HTTP API of real node processes.

First one streamed answer whose serving node is SIGKILLed mid-stream: the
client's SSE stream simply goes on, resumed elsewhere from the tokens
already sent, and the whole text is checked against what the simulated
engine must produce. Then a short version of `p2pinfer bench faults`: 50
concurrent streaming requests, the node serving them killed, every one
completes or fails explicitly, and the restarted node rejoins empty.
"""

from __future__ import annotations

import json
import os
import signal
import time

import httpx
import pytest

from p2pinfer.lab.faults_bench import expected_text, group_prefix, run_faults
from p2pinfer.lab.local_swarm import LocalSwarm

pytestmark = pytest.mark.slow


def peer_view(http: httpx.Client, node, peer_id: str) -> dict | None:
    status = http.get(node.http + "/status", timeout=5).json()
    return next((p for p in status["peers"] if p["peer_id"] == peer_id), None)


def test_sse_stream_continues_when_the_serving_node_is_sigkilled() -> None:
    # --no-check-cache: the entry checks the server's first answers (its probation), and a
    # check would leave the prefix in the entry's own cache, which would then serve the
    # streamed request itself instead of the server this test kills.
    with LocalSwarm(3, engine="simulated", node_args=["--no-check-cache"]) as swarm, httpx.Client(timeout=30) as http:
        swarm.wait_connected()
        prefix = group_prefix(7, 100)
        seeded = http.post(swarm.nodes[1].http + "/v1/completions", json={"prompt": prefix, "max_tokens": 1})
        seeded.raise_for_status()
        # The node that served it holds the prefix (with empty caches the
        # policy may well have sent it elsewhere): that one is killed, and
        # the request enters at another.
        holder = seeded.json()["p2pinfer"]["served_by"]
        server = next(n for n in swarm.nodes if n.peer_id == holder)
        entry = next(n for n in swarm.nodes if n is not server)
        blocks = http.get(server.http + "/status").json()["digest"]["blocks"]
        deadline = time.monotonic() + 20
        while (peer_view(http, entry, server.peer_id) or {}).get("cached_blocks", 0) < blocks:
            assert time.monotonic() < deadline, "the entry node never learned the server's cache"
            time.sleep(0.1)

        # The server's first answers to the entry are held back until checked (its
        # probation, p2pinfer/core/verify.py); after two, its answers stream.
        for q in ("Question: first?", "Question: second?"):
            warm = http.post(entry.http + "/v1/completions", json={"prompt": prefix + q, "max_tokens": 2}).json()
            assert warm["p2pinfer"]["attempts"][-1]["target"] == server.peer_id, warm["p2pinfer"]
            assert warm["p2pinfer"]["attempts"][-1]["check"] == "passed", warm["p2pinfer"]
        # 120 tokens at 11.5 ms each: time enough to kill the server mid-stream.
        prompt = prefix + "Question: and then?"
        body = {"prompt": prompt, "max_tokens": 120, "stream": True}
        text, chunks, final, done, killed_after = "", 0, None, False, None
        with http.stream("POST", entry.http + "/v1/completions", json=body, timeout=60) as resp:
            assert resp.status_code == 200
            for line in resp.iter_lines():
                if line == "data: [DONE]":
                    done = True
                    continue
                if not line.startswith("data: "):
                    continue
                event = json.loads(line[6:])
                assert "error" not in event, event
                choice = event["choices"][0]
                if choice["text"]:
                    text += choice["text"]
                    chunks += 1
                    if chunks == 5:
                        os.killpg(server.process.pid, signal.SIGKILL)
                        killed_after = len(text)
                if choice["finish_reason"]:
                    final = event
        assert done and final is not None and killed_after is not None
        facts = final["p2pinfer"]
        first, last = facts["attempts"][0], facts["attempts"][-1]
        assert first["target"] == server.peer_id and first["outcome"] == "failed", facts["attempts"]
        assert 5 <= first["generated_tokens"] < 120
        assert last["outcome"] == "done" and last["resumed_tokens"] == first["generated_tokens"]
        assert final["usage"]["completion_tokens"] == 120
        # Nothing repeated, nothing dropped: the server's tokens, then the
        # fallback's continuation of the prompt plus those tokens.
        assert text == expected_text(prompt, facts["attempts"])
        assert server.process.poll() is not None  # it really died

        # The survivor still answers, and still refuses absurd requests clearly.
        ok = http.post(entry.http + "/v1/completions", json={"prompt": prompt, "max_tokens": 2})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2
        absurd = http.post(entry.http + "/v1/completions", json={"prompt": "x", "max_tokens": 10**9})
        assert absurd.status_code == 400 and "max_tokens" in absurd.json()["error"]["message"]
        huge = http.post(entry.http + "/v1/completions", json={"prompt": "word " * 100_000, "max_tokens": 2})
        assert huge.status_code == 413 and huge.json()["error"]["code"] == "prompt_too_large"


def test_fifty_concurrent_streams_survive_a_sigkill_and_the_node_rejoins_empty() -> None:
    result = run_faults(requests=50, max_tokens=16, seed=2)
    assert result["hung"] == 0 and result["lost"] == 0 and result["corrupt"] == 0, result
    assert result["completed"] + result["failed_explicitly"] == 50, result["outcomes"]
    assert result["completed"] > 0
    assert result["retried_after_the_kill"] > 0  # the kill really hit work in flight
    assert result["victim_left_every_view_s"] is not None
    assert result["victim_rejoined_empty_s"] is not None
    assert result["nodes_alive_at_end"] == 4


def test_a_kill_mid_stream_resumes_answers_from_the_tokens_already_sent() -> None:
    """`--kill-after-chunks`: the kill lands after the victim has streamed tokens, so some answers
    are resumed on a survivor from where they stopped, and each text is still exactly right."""
    result = run_faults(requests=30, max_tokens=48, seed=3, restart=False, kill_after_chunks=20)
    assert result["hung"] == 0 and result["lost"] == 0 and result["corrupt"] == 0, result
    assert result["completed"] + result["failed_explicitly"] == 30, result["outcomes"]
    assert result["chunks_before_kill"] >= 20
    assert result["resumed_mid_stream"] >= 1, result
