"""A streamed answer ends with its last token, not after its reply is saved (issue 18), on a
real llama.cpp node: the SSE stream's [DONE] arrives while the node still saves the reply (its
digest lists prompt and reply meanwhile), and a next turn sent at once reuses prompt and reply."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
import trio

pytestmark = pytest.mark.model

HISTORY = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Write a long story about a dragon and a knight."},
]


async def test_the_sse_stream_ends_before_the_reply_is_saved_and_the_next_turn_still_reuses_it(
    nursery: trio.Nursery,
) -> None:
    from p2pinfer.api import ApiLimits, serve_http
    from p2pinfer.node import Node, NodeConfig

    config = NodeConfig(listen=("/ip4/127.0.0.1/tcp/0",), engine="llama-cpp",
                        engine_options={"threads": 1, "context_size": 2048, "slots": 2})
    async with Node(config) as node:
        host, port = await nursery.start(lambda task_status: serve_http(node, "127.0.0.1", 0, limits=ApiLimits(),
                                                                         task_status=task_status))
        base = f"http://{host}:{port}"

        def first_turn() -> dict[str, Any]:
            text, facts, usage, last = [], None, None, 0.0
            body = {"messages": HISTORY, "max_tokens": 120, "temperature": 0, "stream": True,
                    "stream_options": {"include_usage": True}}
            with httpx.Client(base_url=base, timeout=120) as http:
                with http.stream("POST", "/v1/chat/completions", json=body) as resp:
                    for line in resp.iter_lines():
                        if not line.startswith("data: "):
                            continue
                        if line == "data: [DONE]":
                            done = time.perf_counter()
                            break
                        chunk = json.loads(line[6:])
                        if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                            text.append(chunk["choices"][0]["delta"]["content"])
                            last = time.perf_counter()
                        facts = chunk.get("p2pinfer", facts)
                        usage = chunk.get("usage") or usage
                at_done = http.get("/status").json()
                saves_at_done, blocks_at_done = at_done["engine"]["reply_saves"], at_done["digest"]["blocks"]
                while (saves := http.get("/status").json()["engine"]["reply_saves"])["in_progress"]:
                    time.sleep(0.005)
                saved = time.perf_counter()
            return {"text": "".join(text), "facts": facts, "usage": usage, "stream_end_s": done - last,
                    "save_s": saved - last, "saves_at_done": saves_at_done, "saves": saves,
                    "blocks_at_done": blocks_at_done}

        first = await trio.to_thread.run_sync(first_turn)
        assert first["facts"] is not None and "reply_save_ms" not in first["facts"]
        # [DONE] came while the reply was being saved, well before the save ended.
        assert first["saves_at_done"]["in_progress"] == 1 and first["saves_at_done"]["count"] == 0, first
        assert first["stream_end_s"] < first["save_s"] / 5, first
        assert first["saves"]["count"] == 1 and first["saves"]["errors"] == 0 and first["saves"]["last_ms"] > 0

        tail = len(node.engine.chat_reply.tail)  # type: ignore[attr-defined]
        previous = first["usage"]["prompt_tokens"] + first["usage"]["completion_tokens"] + tail
        # Meanwhile the digest listed prompt and reply as in service: peers could route the next turn here.
        assert first["blocks_at_done"] == previous // node.router.hasher.block_size, (first, previous)
        history = [*HISTORY, {"role": "assistant", "content": first["text"]}, {"role": "user", "content": "Go on."}]

        def turn(messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
            return httpx.post(base + "/v1/chat/completions", timeout=120,
                              json={"messages": messages, "max_tokens": max_tokens, "temperature": 0}).json()

        node.engine.cache.clear()  # type: ignore[attr-defined]
        # Now send the first turn again (a non-streamed answer ends as early) and the next turn the moment it ends.
        again = await trio.to_thread.run_sync(turn, HISTORY, 120)
        assert again["choices"][0]["message"]["content"] == first["text"]
        second = await trio.to_thread.run_sync(turn, history, 8)
        reused = second["p2pinfer"]["reused_tokens"]
        assert reused == previous, (second, first["usage"])
