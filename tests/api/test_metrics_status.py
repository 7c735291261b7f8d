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


async def test_reply_saves_are_a_histogram_in_metrics_and_counted_in_status(api: Any) -> None:
    """A reply is saved after its request ended, so its time is reported by the
    node (issue 18), not in any request's facts."""
    from p2pinfer.engines.reply_saves import ReplySaves

    saves = ReplySaves()
    api.node.engine.reply_saves = saves  # the simulated engine saves none; as the llama.cpp engine counts them
    for work_s in (0.2, 0.4, 3.0):
        saves.started()
        saves.ended(work_s, work_s + 0.1)
    saves.started()
    saves.ended(0.05, 0.06, failed=True)
    saves.started()  # one still going
    saves.started()
    saves.gave_up()  # and one given up: a request needed its slot

    def call() -> tuple[str, dict[str, Any], dict[str, Any]]:
        answer = httpx.post(api.base_url + "/v1/completions", json={"prompt": "question", "max_tokens": 2}).json()
        return httpx.get(api.base_url + "/metrics").text, httpx.get(api.base_url + "/status").json(), answer

    text, status, answer = await trio.to_thread.run_sync(call)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    samples = {(s.name, s.labels.get("le")): s.value for s in families["p2pinfer_reply_save_seconds"].samples}
    assert samples[("p2pinfer_reply_save_seconds_count", None)] == 4
    assert samples[("p2pinfer_reply_save_seconds_sum", None)] == 0.2 + 0.4 + 3.0 + 0.05
    assert samples[("p2pinfer_reply_save_seconds_bucket", "0.25")] == 2
    assert samples[("p2pinfer_reply_save_seconds_bucket", "2.5")] == 3
    assert samples[("p2pinfer_reply_save_seconds_bucket", "+Inf")] == 4
    assert families["p2pinfer_reply_save_errors"].samples[0].value == 1
    assert families["p2pinfer_reply_saves_in_progress"].samples[0].value == 1
    assert families["p2pinfer_reply_saves_dropped"].samples[0].value == 1
    assert status["engine"]["reply_saves"] == {
        "count": 4, "errors": 1, "dropped": 1, "in_progress": 1, "last_ms": 50.0, "last_wall_ms": 60.0,
        "median_ms": 300.0, "median_of_last": 4, "total_ms": 3650.0,
    }
    assert "reply_save_ms" not in answer["p2pinfer"]
