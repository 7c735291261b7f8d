"""``p2pinfer bench load``: many concurrent HTTP clients against a local swarm.

Every request must end in exactly one of: a complete answer, or an explicit
refusal (HTTP 503 with ``Retry-After`` when the swarm is saturated, or
another OpenAI-style error). A request with no answer at all (timeout,
reset connection, truncated stream) is *lost*, and the benchmark reports it.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from typing import Any

from ..core.costmodel import EngineCostModel


async def _client_loop(client: Any, urls: list[str], prompts: list[str], stop_at: float, rng: random.Random,
                       stats: dict[str, Any], max_tokens: int) -> None:
    import httpx
    import trio

    while trio.current_time() < stop_at:
        url = urls[rng.randrange(len(urls))]
        body = {"prompt": prompts[rng.randrange(len(prompts))], "max_tokens": max_tokens, "stream": True}
        t0 = time.perf_counter()
        stats["sent"] += 1
        outcome = "lost"
        try:
            async with client.stream("POST", url + "/v1/completions", json=body) as resp:
                if resp.status_code == 200:
                    got_done = False
                    tokens = 0
                    async for line in resp.aiter_lines():
                        if line == "data: [DONE]":
                            got_done = True
                        elif line.startswith("data: "):
                            event = json.loads(line[6:])
                            if "error" in event:
                                outcome = "error_event"
                            elif event.get("choices") and event["choices"][0].get("finish_reason"):
                                tokens = event["usage"]["completion_tokens"]
                    if got_done and outcome != "error_event":
                        outcome = "ok" if tokens == max_tokens else "short"
                else:
                    await resp.aread()
                    if resp.status_code == 503:
                        outcome = "503_retry_after" if resp.headers.get("retry-after") else "503_without_retry_after"
                        retry = float(resp.headers.get("retry-after") or 1)
                    else:
                        outcome = f"http_{resp.status_code}"
        except (httpx.HTTPError, OSError) as exc:
            outcome = "lost"
            stats["lost_examples"].append(f"{type(exc).__name__}: {exc}"[:200])
        latency = (time.perf_counter() - t0) * 1000
        stats["outcomes"][outcome] = stats["outcomes"].get(outcome, 0) + 1
        if outcome == "ok":
            stats["latency_ms"].append(latency)
        elif outcome.startswith("503"):
            await trio.sleep(min(retry, 5.0) * rng.uniform(0.5, 1.0))  # honour Retry-After, with jitter


def run_load(nodes: int, clients: int, duration_s: float, max_tokens: int, seed: int,
             max_concurrent: int) -> dict[str, Any]:
    import httpx
    import trio

    from ..lab.local_swarm import LocalSwarm
    from ..workloads.mmlu import MMLUWorkload, load_mmlu

    workload = MMLUWorkload(load_mmlu()[:8], seed=seed)
    rng = random.Random(seed)
    prompts = ["".join(workload.draw(rng).parts) for _ in range(200)]
    args = ["--max-concurrent", str(max_concurrent)]
    with LocalSwarm(nodes, engine="simulated", node_args=args) as swarm:
        swarm.wait_connected()
        urls = [n.http for n in swarm.nodes]
        stats: dict[str, Any] = {"sent": 0, "outcomes": {}, "latency_ms": [], "lost_examples": []}

        async def main() -> float:
            limits = httpx.Limits(max_connections=clients + 10, max_keepalive_connections=clients + 10)
            timeout = httpx.Timeout(10.0, read=120.0)
            async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
                t0 = trio.current_time()
                stop_at = t0 + duration_s
                async with trio.open_nursery() as nursery:
                    for i in range(clients):
                        nursery.start_soon(_client_loop, client, urls, prompts, stop_at,
                                           random.Random(seed * 1000 + i), stats, max_tokens)
                return trio.current_time() - t0

        elapsed = trio.run(main)
        alive = [n.alive() for n in swarm.nodes]
    lat = sorted(stats["latency_ms"])
    ok = stats["outcomes"].get("ok", 0)
    answered_explicitly = sum(v for k, v in stats["outcomes"].items() if k != "lost")
    return {
        "benchmark": "load",
        "nodes": nodes,
        "engine": "simulated (calibrated cost model: real queueing, no weights)",
        "cost_model": EngineCostModel().as_dict(),
        "clients": clients,
        "requested_duration_s": duration_s,
        # Clients send for requested_duration_s, then the requests in flight finish: until the last one ended.
        "duration_s": round(elapsed, 2),
        "max_tokens": max_tokens,
        "max_concurrent_per_node": max_concurrent,
        "requests_sent": stats["sent"],
        "outcomes": stats["outcomes"],
        "lost": stats["outcomes"].get("lost", 0),
        "answered_explicitly": answered_explicitly,
        "throughput_rps": round(ok / elapsed, 2),
        "latency_ms": {
            "p50": round(statistics.median(lat), 1) if lat else None,
            "p99": round(lat[min(len(lat) - 1, int(0.99 * len(lat)))], 1) if lat else None,
        },
        "nodes_alive_at_end": sum(alive),
        "lost_examples": stats["lost_examples"][:5],
    }
