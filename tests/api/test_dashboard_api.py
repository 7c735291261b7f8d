"""The dashboard's server side (issue 20): decision log, prefix groups, event stream, login; no browser."""

from __future__ import annotations

from collections.abc import AsyncIterator
import json
from typing import Any

import httpx
import pytest
import trio

from p2pinfer.api import ApiKeys, ApiLimits, serve_http
from p2pinfer.api import dashboard
from p2pinfer.node import Node, NodeConfig
from p2pinfer.node.decisions import GROUP_BLOCKS, DecisionLog, PrefixGroups, prompt_label

Api = Any  # the `api` fixture of conftest.py: .node, .base_url, .limits

KEY = "sk-dashboard-0123456789"
PROMPT = "The following are multiple choice questions (with answers) about astronomy.\n\n" + "Which planet? " * 30


def test_decision_log_keeps_the_last_entries_numbered_and_wakes_listeners() -> None:
    log = DecisionLog(capacity=3)
    woken: list[int] = []
    log.subscribe(lambda: woken.append(log.seq))
    for i in range(5):
        log.append({"n": i})
    assert len(log) == 3 and log.seq == 5 and woken == [1, 2, 3, 4, 5]
    assert [e["n"] for e in log.since(0)] == [2, 3, 4]
    assert [e["seq"] for e in log.since(3)] == [4, 5]
    assert log.since(5) == [] and [e["n"] for e in log.since(0, limit=1)] == [4]
    with pytest.raises(ValueError):
        DecisionLog(capacity=0)


def test_prefix_groups_follow_the_shared_prefix_and_count_who_served_from_cache() -> None:
    groups = PrefixGroups(block_size=2, capacity=2)
    a = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    hashes_a = [100 + i for i in range(6)]
    hashes_b = hashes_a[:5] + [999]  # the same first GROUP_BLOCKS blocks, diverging at the sixth
    assert GROUP_BLOCKS <= 5
    g = groups.note(a, hashes_a, "peer-x", 0, lambda t: f"label {len(t)}", now=1.0)
    assert g is not None and g.label == f"label {GROUP_BLOCKS * 2}" and len(g.tokens) == 12
    g2 = groups.note(a[:10] + [0, 0], hashes_b, "peer-y", 8, lambda t: "unused", now=2.0)
    assert g2 is g and len(g.hashes) == 5 and len(g.tokens) == 10  # shrunk to what both share
    assert g.served == {"peer-x": 1, "peer-y": 1} and g.hits == {"peer-y": 1} and g.reused_tokens == 8
    assert groups.note([1], [], "peer-x", 0, lambda t: "", now=3.0) is None  # under one block: no group
    held = groups.holdings(lambda hashes: {"peer-x": 3}, "me", lambda tokens: 4)
    assert held[0]["held_tokens"] == {"peer-x": 6, "me": 4} and held[0]["prefix_tokens"] == 10
    for i in range(3):  # capacity 2: the least recently used goes
        groups.note(a, [500 + i] * 6, "peer-z", 0, lambda t: "other", now=4.0 + i)
    assert len(groups) == 2 and g.key not in {x.key for x in groups.groups()}


def test_prompt_label_skips_chat_markers_and_role_names() -> None:
    assert prompt_label("<|im_start|>system\nYou are a helpful pirate.<|im_end|>\n<|im_start|>user\nHi") == \
        "You are a helpful pirate."
    assert prompt_label("") == "(empty prompt)"
    assert prompt_label("x" * 200).endswith("…") and len(prompt_label("x" * 200)) == 90


async def _events(client: httpx.AsyncClient, url: str, wanted: int, until: str | None = None) -> list[tuple[str, Any]]:
    """The first ``wanted`` events, or (``until``) every event up to the first of that name."""
    out: list[tuple[str, Any]] = []
    name = ""
    async with client.stream("GET", url) as resp:
        assert resp.status_code == 200, await resp.aread()
        assert resp.headers["content-type"].startswith("text/event-stream")
        async for line in resp.aiter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                out.append((name, json.loads(line[6:])))
                if (name == until) if until else len(out) >= wanted:
                    break
    return out


async def test_the_event_stream_says_hello_with_the_decisions_then_pushes_new_ones(api: Api) -> None:
    async with httpx.AsyncClient(base_url=api.base_url, timeout=30) as http:
        first = await http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2})
        assert first.status_code == 200
        rid = first.json()["p2pinfer"]["request_id"]
        got: list[tuple[str, Any]] = []

        async def listen() -> None:
            with trio.fail_after(20):
                got.extend(await _events(http, "/dashboard/events", 0, until="decisions"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(listen)
            await trio.sleep(0.5)
            second = await http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2})
        names = [n for n, _ in got]
        assert names[:2] == ["hello", "snapshot"] and "decisions" in names
        hello = got[0][1]
        entry = next(e for e in hello["decisions"] if e["request_id"] == rid)
        assert entry["entry"] == api.node.peer_id and entry["outcome"] == "ok" and entry["local"] is True
        assert entry["group_label"].startswith("The following are multiple choice questions (with answers) about astronomy")
        pushed = next(d for n, d in got if n == "decisions")
        assert pushed[-1]["request_id"] == second.json()["p2pinfer"]["request_id"]
        assert pushed[-1]["reused_tokens"] == second.json()["p2pinfer"]["reused_tokens"] > 0  # the header, cached
        snapshot = got[1][1]
        assert snapshot["node"]["peer_id"] == api.node.peer_id and snapshot["peers"] == []
        group = snapshot["groups"][0]
        assert group["held_tokens"][api.node.peer_id] >= group["prefix_tokens"] > 0
        point = snapshot["point"]
        assert point["group_copies"] == 1  # one node, holding the group
        assert point["requests"] >= 1 and point["ttft_p50_ms"] > 0 and point["forwarded_share"] == 0


async def test_the_page_is_sent_with_a_strict_content_security_policy(api: Api) -> None:
    async with httpx.AsyncClient(base_url=api.base_url) as http:
        page = await http.get("/dashboard")
        assert page.status_code == 200 and "<title>p2pinfer dashboard</title>" in page.text
        assert "default-src 'self'" in page.headers["content-security-policy"]
        assert page.headers["x-frame-options"] == "DENY"
        js = await http.get("/dashboard/static/dashboard.js")
        assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
        missing = await http.get("/dashboard/static/../app.py")
        assert missing.status_code == 404
        assert (await http.get("/dashboard/static/secret.txt")).json()["error"]["code"] == "not_found"
        assert (await http.get("/dashboard/session")).json() == {"auth_required": False, "authenticated": True}


async def test_more_streams_than_the_limit_get_503(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dashboard, "MAX_STREAMS", 1)
    async with httpx.AsyncClient(base_url=api.base_url, timeout=10) as http:
        async with http.stream("GET", "/dashboard/events") as first:
            assert first.status_code == 200
            async for _ in first.aiter_lines():
                break
            second = await http.get("/dashboard/events")
            assert second.status_code == 503 and second.headers["retry-after"]


@pytest.fixture
async def keyed(nursery: trio.Nursery) -> AsyncIterator[str]:
    config = NodeConfig(listen=("/ip4/127.0.0.1/tcp/0",), engine="simulated", engine_options={"speed": 0})
    async with Node(config) as node:
        host, port = await nursery.start(lambda task_status: serve_http(
            node, "127.0.0.1", 0, limits=ApiLimits(), keys=ApiKeys([KEY]), task_status=task_status))
        yield f"http://{host}:{port}"
        nursery.cancel_scope.cancel()


async def test_login_exchanges_the_key_for_an_httponly_session_cookie(keyed: str) -> None:
    async with httpx.AsyncClient(base_url=keyed, timeout=10) as http:
        assert (await http.get("/dashboard")).status_code == 200
        assert (await http.get("/dashboard/session")).json() == {"auth_required": True, "authenticated": False}
        assert (await http.get("/dashboard/events")).status_code == 401
        wrong = await http.post("/dashboard/login", json={"api_key": "sk-not-the-key-000"})
        assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
        bad = await http.post("/dashboard/login", content=b"api_key=x")
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "api_key"
        ok = await http.post("/dashboard/login", json={"api_key": KEY})
        assert ok.status_code == 200
        cookie = ok.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and "path=/" in cookie
        assert (await http.get("/dashboard/session")).json()["authenticated"] is True
        assert (await http.get("/status")).status_code == 200  # the cookie authorises reads
        body = {"prompt": "hi there", "max_tokens": 1}
        no_header = await http.post("/v1/completions", json=body)
        assert no_header.status_code == 403 and no_header.json()["error"]["code"] == "missing_csrf_header"
        with_header = await http.post("/v1/completions", json=body, headers={"X-P2PInfer-Dashboard": "1"})
        assert with_header.status_code == 200
        got = await _events(http, "/dashboard/events", 1)
        assert got[0][0] == "hello"
        token = http.cookies["p2pinfer_session"]
        await http.post("/dashboard/logout", headers={"X-P2PInfer-Dashboard": "1"})
        assert http.cookies.get("p2pinfer_session") is None
    for stale in (token, "forged-token"):  # revoked at logout, or never issued
        async with httpx.AsyncClient(base_url=keyed, timeout=10, cookies={"p2pinfer_session": stale}) as http:
            refused = await http.get("/status")
            assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_session"
