from __future__ import annotations

from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
import trio


async def test_metrics_parse_and_count_requests(api: Any) -> None:
    def call() -> str:
        for i in range(3):
            httpx.post(api.base_url + "/v1/completions", json={"prompt": f"question {i}", "max_tokens": 2})
        httpx.post(api.base_url + "/v1/completions", json={"prompt": "x", "max_tokens": 0})
        return httpx.get(api.base_url + "/metrics").text

    text = await trio.to_thread.run_sync(call)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    requests = {s.labels["outcome"]: s.value for s in families["p2pinfer_requests"].samples if s.name.endswith("_total")}
    assert requests["ok"] == 3
    ttft = families["p2pinfer_time_to_first_token_seconds"]
    assert any(s.name.endswith("_count") and s.value == 3 for s in ttft.samples)
    routed = {s.labels["where"]: s.value for s in families["p2pinfer_routed"].samples if s.name.endswith("_total")}
    assert routed == {"local": 3}
    for name in ("p2pinfer_peers", "p2pinfer_cached_tokens", "p2pinfer_gossip_bytes",
                 "p2pinfer_predicted_reused_tokens", "p2pinfer_realised_reused_tokens"):
        assert name in families
    cached = families["p2pinfer_cached_tokens"].samples[0].value
    assert cached == api.node.engine.cache.total_tokens > 0


async def test_status_is_json_about_node_and_peers(api: Any) -> None:
    r = await trio.to_thread.run_sync(lambda: httpx.get(api.base_url + "/status"))
    status = r.json()
    assert status["peer_id"] == api.node.peer_id
    assert status["peers"] == [] and "digest" in status and "load" in status


async def test_unknown_route_is_openai_style_404(api: Any) -> None:
    r = await trio.to_thread.run_sync(lambda: httpx.get(api.base_url + "/v1/nothing"))
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = await trio.to_thread.run_sync(lambda: httpx.get(api.base_url + "/v1/completions"))
    assert r.status_code == 405
