"""The HTTP API against the official openai client, streaming and not."""

from __future__ import annotations

import httpx
import openai
import pytest
import trio

from typing import Any

Api = Any  # the `api` fixture of conftest.py: .node, .base_url, .limits


def client(api: Api) -> openai.OpenAI:
    return openai.OpenAI(base_url=api.base_url + "/v1", api_key="unused", max_retries=0)


async def test_completion_with_openai_client(api: Api) -> None:
    def call():
        return client(api).completions.create(model=api.node.engine.model_name, prompt="The sky is", max_tokens=5)

    resp = await trio.to_thread.run_sync(call)
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage is not None and resp.usage.completion_tokens == 5
    facts = resp.model_extra["p2pinfer"]  # type: ignore[index]
    assert facts["served_by"] == api.node.peer_id and facts["hops"] == 0
    assert {"predicted_reused_tokens", "reused_tokens", "reason"} <= facts.keys()


async def test_second_request_reuses_cache(api: Api) -> None:
    prompt = "A long shared prefix about astronomy and stars. " * 20

    def call():
        c = client(api)
        c.completions.create(model="default", prompt=prompt + "Q1", max_tokens=2)
        return c.completions.create(model="default", prompt=prompt + "Q2", max_tokens=2)

    resp = await trio.to_thread.run_sync(call)
    facts = resp.model_extra["p2pinfer"]  # type: ignore[index]
    assert facts["reused_tokens"] > 100
    assert resp.usage.prompt_tokens_details.cached_tokens == facts["reused_tokens"]  # type: ignore[union-attr]


async def test_chat_streaming_with_openai_client(api: Api) -> None:
    def call():
        stream = client(api).chat.completions.create(
            model=api.node.engine.model_name,
            messages=[{"role": "user", "content": "Say hello"}],
            max_tokens=4,
            stream=True,
        )
        return list(stream)

    chunks = await trio.to_thread.run_sync(call)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text
    assert chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].model_extra["p2pinfer"]["served_by"] == api.node.peer_id  # type: ignore[index]


async def test_completion_streaming_with_openai_client(api: Api) -> None:
    def call():
        return list(client(api).completions.create(model="default", prompt="Count: one two", max_tokens=3, stream=True))

    chunks = await trio.to_thread.run_sync(call)
    assert sum(1 for c in chunks if c.choices[0].text) == 3
    assert chunks[-1].choices[0].finish_reason == "length"


async def test_models_lists_the_model(api: Api) -> None:
    models = await trio.to_thread.run_sync(lambda: client(api).models.list())
    assert [m.id for m in models.data] == [api.node.engine.model_name]
    facts = models.data[0].model_extra["p2pinfer"]  # type: ignore[index]
    assert facts == {"fingerprint": api.node.router.fingerprint_hex, "nodes": 1, "served_here": True, "engine": "simulated"}


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (b"{not json", 400, None),
        (b"[1, 2]", 400, None),
        (b'{"prompt": 5}', 400, "prompt"),
        (b'{"prompt": "x", "max_tokens": -1}', 400, "max_tokens"),
        (b'{"prompt": "x", "max_tokens": true}', 400, "max_tokens"),
        (b'{"prompt": "x", "temperature": "hot"}', 400, "temperature"),
        (b'{"prompt": "x", "n": 3}', 400, "n"),
        (b'{"prompt": "x", "model": "gpt-9"}', 404, "model"),
        (b'{"prompt": "x", "max_tokens": 8192}', 413, "prompt"),
        (b'{"prompt": "\\ud800"}', 400, "prompt"),
        (b'{"prompt": "x", "guided_json": {}}', 400, "guided_json"),
        (b'{"prompt": "x", "echo": true}', 400, "echo"),
        (b'{"prompt": "x", "presence_penalty": 3}', 400, "presence_penalty"),
        (b'{"prompt": "x", "repetition_penalty": 0}', 400, "repetition_penalty"),
        (b'{"prompt": "x", "stream_options": {"include_usage": true}}', 400, "stream_options"),
        (b'{"prompt": "x", "tools": []}', 400, "tools"),
    ],
)
async def test_bad_requests_get_openai_errors(api: Api, body: bytes, status: int, param: str | None) -> None:
    r = await trio.to_thread.run_sync(
        lambda: httpx.post(api.base_url + "/v1/completions", content=body, headers={"content-type": "application/json"})
    )
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"] and err["param"] == param


async def test_openai_client_raises_on_bad_request(api: Api) -> None:
    def call():
        client(api).chat.completions.create(model="default", messages=[], max_tokens=2)

    with pytest.raises(openai.BadRequestError, match="messages"):
        await trio.to_thread.run_sync(call)


async def test_oversized_body_is_413(api: Api) -> None:
    body = b'{"prompt": "' + b"a" * (2 << 20) + b'"}'
    r = await trio.to_thread.run_sync(lambda: httpx.post(api.base_url + "/v1/completions", content=body))
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"


async def test_node_keeps_serving_after_bad_input(api: Api) -> None:
    def call():
        for junk in (b"\xff\xfe", b"{}", b'{"messages": [{"role": "wizard", "content": 1}]}'):
            httpx.post(api.base_url + "/v1/chat/completions", content=junk)
        return httpx.post(api.base_url + "/v1/completions", json={"prompt": "still alive?", "max_tokens": 2})

    r = await trio.to_thread.run_sync(call)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


async def test_saturated_node_answers_503_with_retry_after(nursery: trio.Nursery) -> None:
    # A node whose one admission slot is really taken by a request in flight
    # (the simulated engine at its calibrated speed: sleeps, not CPU work).
    from p2pinfer.api import ApiLimits, serve_http
    from p2pinfer.node import Node, NodeConfig

    config = NodeConfig(listen=("/ip4/127.0.0.1/tcp/0",), engine="simulated", engine_options={"speed": 1.0})
    async with Node(config) as node:
        limits = ApiLimits(max_concurrent=1)
        host, port = await nursery.start(lambda task_status: serve_http(node, "127.0.0.1", 0, limits=limits, task_status=task_status))
        url = f"http://{host}:{port}/v1/completions"

        def call() -> tuple[httpx.Response, int, httpx.Response]:
            with httpx.Client(timeout=60) as http:
                with http.stream("POST", url, json={"prompt": "x", "max_tokens": 100, "stream": True}) as first:
                    lines = first.iter_lines()
                    next(line for line in lines if line.startswith("data: "))  # it is being served
                    refused = http.post(url, json={"prompt": "x", "max_tokens": 1})
                    in_flight = limits.active
                    for _ in lines:  # let it finish
                        pass
                return refused, in_flight, http.post(url, json={"prompt": "x", "max_tokens": 1})

        refused, in_flight, after = await trio.to_thread.run_sync(call)
        assert in_flight == 1
        assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
        assert refused.json()["error"]["code"] == "overloaded"
        assert after.status_code == 200  # the slot is free again once the first is done
        nursery.cancel_scope.cancel()


async def test_a_field_the_engine_cannot_honour_is_refused_not_ignored(api: Api) -> None:
    # The simulated engine's tokens come from a cost model: penalties and logprobs mean nothing there.
    for body in ({"prompt": "x", "frequency_penalty": 1.0}, {"prompt": "x", "logprobs": 1}):
        r = await trio.to_thread.run_sync(lambda: httpx.post(api.base_url + "/v1/completions", json=body))
        assert r.status_code == 400 and "cannot honour" in r.json()["error"]["message"], r.text
