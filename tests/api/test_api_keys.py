"""API keys (issue 16): OpenAI clients' Bearer keys, checked on every route, 401s in OpenAI's format."""

from __future__ import annotations

from collections.abc import AsyncIterator
import subprocess
import sys

import httpx
import openai
import pytest
import trio

from p2pinfer.api import ApiKeys, ApiLimits, serve_http
from p2pinfer.api.auth import ExposureError, check_exposure, load_key_file
from p2pinfer.node import Node, NodeConfig

KEY = "sk-test-0123456789"
OTHER = "sk-second-key-abcdef"


@pytest.fixture
async def keyed(nursery: trio.Nursery) -> AsyncIterator[str]:
    config = NodeConfig(listen=("/ip4/127.0.0.1/tcp/0",), engine="simulated", engine_options={"speed": 0})
    keys = ApiKeys([KEY, OTHER], open_routes=["/health"])
    async with Node(config) as node:
        host, port = await nursery.start(
            lambda task_status: serve_http(node, "127.0.0.1", 0, limits=ApiLimits(), keys=keys, task_status=task_status)
        )
        yield f"http://{host}:{port}"
        nursery.cancel_scope.cancel()


async def test_openai_client_without_the_key_gets_401_and_with_it_succeeds(keyed: str) -> None:
    def call(key: str) -> object:
        client = openai.OpenAI(base_url=keyed + "/v1", api_key=key, max_retries=0)
        return client.completions.create(model="default", prompt="The sky is", max_tokens=3)

    with pytest.raises(openai.AuthenticationError) as err:
        await trio.to_thread.run_sync(call, "sk-wrong-key-000000")
    assert err.value.status_code == 401
    assert err.value.body["code"] == "invalid_api_key"  # type: ignore[index]
    for key in (KEY, OTHER):  # either configured key works
        resp = await trio.to_thread.run_sync(call, key)
        assert resp.usage.completion_tokens == 3  # type: ignore[attr-defined]


async def test_every_route_needs_the_key_except_the_open_ones(keyed: str) -> None:
    async with httpx.AsyncClient(base_url=keyed) as http:
        for method, path in [("GET", "/status"), ("GET", "/metrics"), ("GET", "/v1/models"),
                             ("POST", "/v1/chat/completions"), ("GET", "/no/such/route")]:
            resp = await http.request(method, path, json={} if method == "POST" else None)
            assert resp.status_code == 401, path
            assert resp.json()["error"]["code"] == "missing_api_key", path
            assert resp.headers["www-authenticate"].startswith("Bearer")
        bad = await http.get("/status", headers={"Authorization": f"Basic {KEY}"})
        assert bad.status_code == 401 and bad.json()["error"]["code"] == "invalid_api_key"
        ok = await http.get("/status", headers={"Authorization": f"Bearer {KEY}"})
        assert ok.status_code == 200 and ok.json()["peer_id"]
        metrics = await http.get("/metrics", headers={"Authorization": f"Bearer {OTHER}"})
        assert metrics.status_code == 200
        assert (await http.get("/health")).status_code == 200  # open route


async def test_streaming_works_through_the_key_check(keyed: str) -> None:
    def call() -> list[str]:
        client = openai.OpenAI(base_url=keyed + "/v1", api_key=KEY, max_retries=0)
        stream = client.chat.completions.create(model="default", messages=[{"role": "user", "content": "Hi"}],
                                                max_tokens=4, stream=True)
        return [c.choices[0].delta.content or "" for c in stream if c.choices]

    pieces = await trio.to_thread.run_sync(call)
    assert len("".join(pieces)) > 0


def test_keys_from_a_file_and_bad_keys(tmp_path) -> None:
    f = tmp_path / "keys.txt"
    f.write_text(f"# operators\n{KEY}\n\n  {OTHER}  \n")
    assert load_key_file(f) == [KEY, OTHER]
    with pytest.raises(ValueError):
        ApiKeys(["short"])
    with pytest.raises(ValueError):
        load_key_file(tmp_path / "missing.txt")


def test_no_key_is_refused_beyond_loopback_unless_explicitly_allowed() -> None:
    none = ApiKeys()
    for host in ("127.0.0.1", "::1", "localhost", "127.3.4.5"):
        check_exposure(host, none, False)
    for host in ("0.0.0.0", "192.0.2.10", "::"):
        with pytest.raises(ExposureError):
            check_exposure(host, none, False)
        check_exposure(host, none, True)
        check_exposure(host, ApiKeys([KEY]), False)


def test_the_node_command_refuses_to_listen_openly_without_a_key() -> None:
    cmd = [sys.executable, "-m", "p2pinfer", "node", "--engine", "simulated", "--http-host", "0.0.0.0",
           "--listen", "/ip4/127.0.0.1/tcp/0", "--key-file", "", "--quiet"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "no key" in proc.stderr and "--allow-unauthenticated" in proc.stderr
