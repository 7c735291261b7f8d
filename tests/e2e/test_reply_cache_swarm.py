"""A conversation's second turn, entering at the other node, reuses the first
turn's prompt *and* reply (issue 16, part 1): two real `p2pinfer node`
processes, the official `openai` client."""

from __future__ import annotations

from pathlib import Path
import time

import httpx
import openai
import pytest

from p2pinfer.lab.local_swarm import LocalSwarm

pytestmark = pytest.mark.model

ARGS = ["--threads", "1", "--slots", "2", "--context-size", "2048", "--cache-tokens", "16384"]
FIRST = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Explain how a bicycle stays upright when it moves."},
]


def _client(node) -> openai.OpenAI:
    return openai.OpenAI(base_url=node.http + "/v1", api_key="unused", max_retries=0, timeout=600)


def _wait_for_blocks(viewer, holder, blocks: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        peers = httpx.get(viewer.http + "/status", timeout=10).json()["peers"]
        if any(p["peer_id"] == holder.peer_id and p["cached_blocks"] >= blocks for p in peers):
            return
        assert time.monotonic() < deadline, peers
        time.sleep(0.1)


def test_the_second_turn_at_the_other_node_goes_to_the_holder_and_reuses_prompt_and_reply(tmp_path: Path) -> None:
    # `paper` follows the longest estimated match whatever the speed estimates of a loaded machine say.
    with LocalSwarm(2, engine="llama-cpp", policy="paper", node_args=ARGS, workdir=tmp_path / "swarm") as swarm:
        swarm.wait_connected()
        a, b = swarm.nodes
        model = _client(a).models.list().data[0].id
        first = _client(a).chat.completions.create(model=model, messages=FIRST, max_tokens=96, temperature=0)
        facts = first.model_extra["p2pinfer"]
        reply = first.choices[0].message.content
        assert reply and first.usage.completion_tokens > 32
        holder, other = (a, b) if facts["served_by"] == a.peer_id else (b, a)
        previous = facts["prompt_tokens"] + first.usage.completion_tokens
        # The holder's digest advertises the reply too: more blocks than the prompt alone fills.
        _wait_for_blocks(other, holder, previous // 16)
        history = [*FIRST, {"role": "assistant", "content": reply}, {"role": "user", "content": "Give me an example."}]
        second = _client(other).chat.completions.create(model=model, messages=history, max_tokens=16, temperature=0)
        again = second.model_extra["p2pinfer"]
        assert again["served_by"] == holder.peer_id and again["hops"] == 1, again["reason"]
        # Prompt and reply came from the holder's cache (the engine's own count), less one block at most.
        assert again["reused_tokens"] >= previous - 16, (again, previous)
        assert second.usage.prompt_tokens_details.cached_tokens == again["reused_tokens"]
        # Caching each reply took the serving engine some time after the answer ended: the holder
        # counts both saves (the first turn's and the forwarded second's) in its /status, not the answers.
        assert "reply_save_ms" not in facts and "reply_save_ms" not in again
        deadline = time.monotonic() + 60
        while (status := httpx.get(holder.http + "/status", timeout=10).json()["engine"])["reply_saves"]["in_progress"]:
            assert time.monotonic() < deadline, status
            time.sleep(0.05)
        assert status["reply_cache"] is True and status["replies_cached"] >= 2
        saves = status["reply_saves"]
        assert saves["count"] == 2 and saves["errors"] == 0 and saves["last_ms"] > 0 and saves["median_ms"] > 0, saves
    # The same second turn cold, in a fresh process without reply caching: the same greedy tokens.
    cold_args = [*ARGS, "--no-reply-cache"]
    with LocalSwarm(1, engine="llama-cpp", policy="paper", node_args=cold_args, workdir=tmp_path / "cold") as cold_swarm:
        node = cold_swarm.nodes[0]
        cold = _client(node).chat.completions.create(model=model, messages=history, max_tokens=16, temperature=0)
        assert cold.model_extra["p2pinfer"]["reused_tokens"] == 0
        cold_status = httpx.get(node.http + "/status", timeout=10).json()["engine"]
        assert cold_status["replies_cached"] == 0 and cold_status["reply_saves"]["count"] == 0  # nothing spent
    assert second.choices[0].message.content == cold.choices[0].message.content
    assert cold.choices[0].message.content
