"""The OpenAI API fields a real client expects, with the official `openai`
client against two real `p2pinfer node` processes (SmolLM2, llama.cpp):
structured output and tool calls (grammar-constrained sampling), logprobs,
penalties, seed, `stream_options.include_usage`; each also on a request that
the entry forwards to the other node, where it must work exactly as locally.
"""

from __future__ import annotations

import json
import math
import time

import httpx
import jsonschema
import openai
import pytest

from p2pinfer.lab.local_swarm import LocalSwarm

pytestmark = pytest.mark.model

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather forecast for a city",
                                           "parameters": SCHEMA}}]
# Long enough (several 16-token blocks) that the holder of its prefix is clearly the best target.
SYSTEM = ("You are a careful assistant for a travel agency. You answer briefly and precisely, and when asked for "
          "data you give exactly the data asked for, nothing else. Our customers plan trips to cities all over "
          "the world, and they rely on what you tell them, so never invent anything and never add commentary. ")


def _wait_cached(entry, holder, blocks: int, timeout_s: float = 30.0) -> None:
    """Until ``entry``'s view of ``holder`` holds at least ``blocks`` blocks."""
    deadline = time.monotonic() + timeout_s
    while True:
        peers = httpx.get(entry.http + "/status", timeout=10).json()["peers"]
        if any(p["peer_id"] == holder.peer_id and p["cached_blocks"] >= blocks for p in peers):
            return
        assert time.monotonic() < deadline, peers
        time.sleep(0.1)


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory):
    # `paper` (longest estimated match): the request goes to whoever holds its prefix, whatever the
    # online speed estimates of a loaded machine say.
    with LocalSwarm(2, engine="llama-cpp", policy="paper", workdir=tmp_path_factory.mktemp("swarm"),
                    node_args=["--threads", "1", "--cache-tokens", "16384", "--context-size", "2048"]) as s:
        s.wait_connected()
        yield s


def _clients(swarm):
    a, b = swarm.nodes
    return a, b, (openai.OpenAI(base_url=n.http + "/v1", api_key="unused", max_retries=0) for n in (a, b))


def _served(resp) -> tuple[str, bool]:
    facts = resp.model_extra["p2pinfer"]
    return facts["served_by"], facts["served_locally"]


def test_json_schema_response_format_returns_valid_json_locally_and_forwarded(swarm) -> None:
    a, b, (ca, cb) = _clients(swarm)
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": "The weather request for Paris for 3 days, as JSON."}]
    fmt = {"type": "json_schema", "json_schema": {"name": "weather_request", "schema": SCHEMA, "strict": True}}
    local = ca.chat.completions.create(model="default", messages=messages, max_tokens=60, temperature=0, response_format=fmt)
    assert _served(local) == (a.peer_id, True)
    jsonschema.validate(json.loads(local.choices[0].message.content), SCHEMA)
    # B holds none of it; A holds the whole prompt: B forwards it to A.
    _wait_cached(b, a, 5)
    remote = cb.chat.completions.create(model="default", messages=messages, max_tokens=60, temperature=0, response_format=fmt)
    assert _served(remote) == (a.peer_id, False)
    jsonschema.validate(json.loads(remote.choices[0].message.content), SCHEMA)
    assert remote.choices[0].message.content == local.choices[0].message.content  # greedy, same grammar: same answer
    # JSON mode: any JSON object.
    obj = cb.chat.completions.create(model="default", max_tokens=80, temperature=0, response_format={"type": "json_object"},
                                     messages=[{"role": "user", "content": "A JSON object describing a cat."}])
    if obj.choices[0].finish_reason == "stop":  # a length cut leaves an unfinished object
        assert isinstance(json.loads(obj.choices[0].message.content), dict)
    assert obj.choices[0].message.content.lstrip().startswith("{")


def test_tools_return_tool_calls_with_arguments_valid_against_the_schema(swarm) -> None:
    a, b, (ca, cb) = _clients(swarm)
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": "What will the weather be in Rome over the next 5 days?"}]
    results = []
    for client, choice in ((ca, "required"), (cb, {"type": "function", "function": {"name": "get_weather"}})):
        resp = client.chat.completions.create(model="default", messages=messages, max_tokens=60, temperature=0,
                                              tools=TOOLS, tool_choice=choice)
        results.append(resp)
        choice0 = resp.choices[0]
        assert choice0.finish_reason == "tool_calls" and choice0.message.content is None
        (call,) = choice0.message.tool_calls
        assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMA)
    # The second went through B to A, which held the prompt (tools instruction included).
    assert _served(results[1])[0] == a.peer_id
    # Streamed: one tool_calls delta, then finish_reason tool_calls.
    chunks = list(ca.chat.completions.create(model="default", messages=messages, max_tokens=60, temperature=0,
                                             tools=TOOLS, tool_choice="required", stream=True))
    deltas = [c.choices[0].delta.tool_calls for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert len(deltas) == 1 and deltas[0][0].function.name == "get_weather"
    jsonschema.validate(json.loads(deltas[0][0].function.arguments), SCHEMA)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # `auto`: the grammar allows a call or text that does not start like one; either way it is well formed.
    auto = ca.chat.completions.create(model="default", messages=messages, max_tokens=40, temperature=0, tools=TOOLS)
    if auto.choices[0].message.tool_calls:
        assert auto.choices[0].finish_reason == "tool_calls"
        jsonschema.validate(json.loads(auto.choices[0].message.tool_calls[0].function.arguments), SCHEMA)
    else:
        assert auto.choices[0].message.content and not auto.choices[0].message.content.startswith("{")
    # A conversation that continues after the call: the call and its result are history.
    follow = ca.chat.completions.create(model="default", max_tokens=8, temperature=0, tools=TOOLS, tool_choice="none", messages=[
        *messages,
        {"role": "assistant", "content": None, "tool_calls": [results[0].choices[0].message.tool_calls[0].model_dump()]},
        {"role": "tool", "tool_call_id": results[0].choices[0].message.tool_calls[0].id, "content": '{"forecast": "sunny"}'},
    ])
    assert follow.choices[0].message.content and follow.choices[0].message.tool_calls is None


def test_logprobs_come_back_locally_and_forwarded(swarm) -> None:
    a, b, (ca, cb) = _clients(swarm)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name a large city in Japan."}]
    resp = ca.chat.completions.create(model="default", messages=messages, max_tokens=6, temperature=0,
                                      logprobs=True, top_logprobs=3)
    assert _served(resp) == (a.peer_id, True)
    content = resp.choices[0].logprobs.content
    assert len(content) == resp.usage.completion_tokens
    assert "".join(t.token for t in content) == resp.choices[0].message.content
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        tops = [x.logprob for x in t.top_logprobs]
        assert tops == sorted(tops, reverse=True) and sum(math.exp(x) for x in tops) <= 1 + 1e-6
        # Greedy: the chosen token is the most likely one.
        assert t.logprob == pytest.approx(tops[0], abs=1e-5)
    # Through B, which holds nothing of it, to A: the same tokens with the same log-probabilities.
    _wait_cached(b, a, 5)
    forwarded = cb.chat.completions.create(model="default", messages=messages, max_tokens=6, temperature=0,
                                           logprobs=True, top_logprobs=3)
    assert _served(forwarded) == (a.peer_id, False)
    got = forwarded.choices[0].logprobs.content
    assert [t.token for t in got] == [t.token for t in content]
    assert [t.logprob for t in got] == pytest.approx([t.logprob for t in content], abs=1e-4)
    # Completions: `logprobs` is the number of alternatives.
    comp = ca.completions.create(model="default", prompt="The capital of Italy is", max_tokens=4, temperature=0, logprobs=2)
    lp = comp.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == comp.usage.completion_tokens
    assert all(len(t) <= 2 for t in lp.top_logprobs) and lp.text_offset[0] == 0


def test_seed_penalties_and_include_usage(swarm) -> None:
    a, b, (ca, cb) = _clients(swarm)
    prompt = SYSTEM + "Write one sentence about the sea."
    draws = [c.completions.create(model="default", prompt=prompt, max_tokens=12, temperature=1.0, seed=1234).choices[0].text
             for c in (ca, ca, cb)]
    assert draws[0] == draws[1] == draws[2]  # the same seed samples the same tokens, forwarded or not
    other = ca.completions.create(model="default", prompt=prompt, max_tokens=12, temperature=1.0, seed=99).choices[0].text
    assert other != draws[0]
    loop = "cat cat cat cat cat cat cat cat"
    plain = ca.completions.create(model="default", prompt=loop, max_tokens=8, temperature=0).choices[0].text
    penalised = ca.completions.create(model="default", prompt=loop, max_tokens=8, temperature=0, frequency_penalty=1.5,
                                      presence_penalty=1.0, extra_body={"repetition_penalty": 1.8}).choices[0].text
    assert penalised != plain
    chunks = list(cb.chat.completions.create(model="default", messages=[{"role": "user", "content": "Hi!"}], max_tokens=4,
                                             stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= 1


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"prompt": "x", "frobnicate": 1}, "frobnicate"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "functions": []}, "functions"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logit_bias": {"5": 3}}, "logit_bias"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "yaml"}}, "response_format"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": True}}, "stream_options"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}, "tool_choice"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "code_interpreter"}]}, "tools"),
        ("/v1/completions", {"prompt": "x", "logprobs": 9}, "logprobs"),
        ("/v1/completions", {"prompt": "x", "response_format": {"type": "json_object"}}, "response_format"),
    ],
)
def test_unsupported_fields_are_a_400_naming_them(swarm, path, body, param) -> None:
    r = httpx.post(swarm.nodes[0].http + path, json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_the_openai_client_sees_a_bad_request_for_an_unsupported_field(swarm) -> None:
    _, _, (ca, _) = _clients(swarm)
    with pytest.raises(openai.BadRequestError) as err:
        ca.chat.completions.create(model="default", messages=[{"role": "user", "content": "x"}], max_tokens=2,
                                   extra_body={"guided_regex": "a+"})
    assert "guided_regex" in err.value.message
