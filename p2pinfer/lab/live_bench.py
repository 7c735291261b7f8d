"""Drive a workload through a live local swarm over HTTP, one policy at a time.

Shared by ``p2pinfer demo`` and ``p2pinfer bench swarm``. For each policy
the swarm's node processes are started fresh (every cache cold), the same
seeded requests are sent to randomly chosen entry nodes through the
OpenAI-compatible API with a fixed concurrency, and the time to first token
is measured at the client, from sending the request to the first streamed
token. The ``p2pinfer`` extension field of each answer gives who served it
and the predicted and realised reused tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
import json
import random
import statistics
import time
from typing import Any

import httpx
import trio

from ..stats import percentile
from .local_swarm import LocalSwarm

__all__ = ["LiveRequest", "PolicyRun", "RequestOutcome", "run_policy", "summarise"]


@dataclass(frozen=True)
class LiveRequest:
    label: str
    prompt: str
    max_tokens: int
    entry: int


@dataclass
class RequestOutcome:
    label: str
    entry: int
    ok: bool
    ttft_ms: float | None = None
    total_ms: float | None = None
    served_by: str | None = None
    hops: int | None = None
    prompt_tokens: int = 0
    predicted: int = 0
    reused: int = 0
    status: int = 0
    error: str | None = None
    engine_queue_ms: float | None = None
    engine_prefill_ms: float | None = None
    """The serving engine's own timing (queue; restore + prefill to the first token)."""
    sent_s: float = 0.0
    """When the client sent it, seconds from the start of the run (to replay
    the same arrivals in the simulator)."""


@dataclass
class PolicyRun:
    policy: str
    outcomes: list[RequestOutcome] = field(default_factory=list)
    wall_s: float = 0.0
    node_peer_ids: list[str] = field(default_factory=list)
    peer_rtt_ms: list[float] = field(default_factory=list)
    """Every node's smoothed RTT to each peer at the end of the run (libp2p ping)."""
    prefill_ms_per_token: list[float] = field(default_factory=list)
    """Every node's own estimate of its prefill speed at the end of the run."""
    kept_swarm: LocalSwarm | None = None
    """The swarm, still running, when :func:`run_policy` was asked to keep it."""


async def _one(client: httpx.AsyncClient, url: str, req: LiveRequest, run_t0: float) -> RequestOutcome:
    out = RequestOutcome(req.label, req.entry, ok=False)
    body = {"prompt": req.prompt, "max_tokens": req.max_tokens, "temperature": 0, "stream": True}
    t0 = time.perf_counter()
    out.sent_s = t0 - run_t0
    try:
        async with client.stream("POST", url + "/v1/completions", json=body) as resp:
            out.status = resp.status_code
            if resp.status_code != 200:
                await resp.aread()
                out.error = resp.text[:300]
                return out
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    out.error = event["error"]["message"]
                    return out
                if out.ttft_ms is None and event["choices"][0].get("text"):
                    out.ttft_ms = (time.perf_counter() - t0) * 1000
                facts = event.get("p2pinfer")
                if facts:
                    out.served_by = facts["served_by"]
                    out.hops = facts["hops"]
                    out.prompt_tokens = facts["prompt_tokens"]
                    out.predicted = facts["predicted_reused_tokens"]
                    out.reused = facts["reused_tokens"]
                    out.engine_queue_ms = facts.get("engine_queue_ms")
                    out.engine_prefill_ms = facts.get("engine_prefill_ms")
                    out.ok = True
    except httpx.HTTPError as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    out.total_ms = (time.perf_counter() - t0) * 1000
    if out.ok and out.ttft_ms is None:
        out.ttft_ms = out.total_ms  # a completion whose only tokens were empty text
    return out


async def drive(urls: Sequence[str], requests: Sequence[LiveRequest], concurrency: int,
                progress: Callable[[RequestOutcome], None] | None = None) -> list[RequestOutcome]:
    """Send ``requests`` in order with at most ``concurrency`` in flight."""
    results: list[RequestOutcome | None] = [None] * len(requests)
    limiter = trio.CapacityLimiter(concurrency)
    timeout = httpx.Timeout(10.0, read=900.0)
    run_t0 = time.perf_counter()
    async with httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_connections=concurrency * 2)) as client:

        async def worker(i: int, req: LiveRequest, started: trio.Event) -> None:
            async with limiter:
                started.set()
                results[i] = await _one(client, urls[req.entry], req, run_t0)
                if progress:
                    progress(results[i])  # type: ignore[arg-type]

        async with trio.open_nursery() as nursery:
            for i, req in enumerate(requests):
                started = trio.Event()
                nursery.start_soon(worker, i, req, started)
                await started.wait()  # keeps arrival order = request order
    return [r for r in results if r is not None]


def run_policy(
    policy: str,
    nodes: int,
    requests: Sequence[LiveRequest],
    *,
    concurrency: int,
    node_args: Sequence[str] = (),
    engine: str = "llama-cpp",
    progress: Callable[[RequestOutcome], None] | None = None,
    wrap: Sequence[Sequence[str]] | None = None,
    hosts: Sequence[str] | None = None,
    start_timeout_s: float = 180.0,
    link_delay_ms: float | None = None,
    on_start: Callable[[LocalSwarm], None] | None = None,
    keep: bool = False,
) -> PolicyRun:
    """Fresh swarm, the workload, then stop: one policy, every cache cold.

    ``on_start(swarm)`` runs once the swarm is connected, before the workload
    (the demo prints the dashboard's address); with ``keep`` the swarm is not
    stopped but handed back as ``run.kept_swarm`` (the caller stops it)."""
    swarm = LocalSwarm(nodes, engine=engine, policy=policy, node_args=node_args, wrap=wrap,
                       host=hosts if hosts else "127.0.0.1", start_timeout_s=start_timeout_s,  # type: ignore[arg-type]
                       link_delay_ms=link_delay_ms)
    swarm.__enter__()
    try:
        swarm.wait_connected(timeout_s=120.0)
        if on_start is not None:
            on_start(swarm)
        urls = [n.http for n in swarm.nodes]
        t0 = time.perf_counter()
        outcomes = trio.run(drive, urls, requests, concurrency, progress)
        swarm.check_alive()  # a node that died mid-run: say why, not just "N requests failed"
        run = PolicyRun(policy, outcomes, time.perf_counter() - t0, [n.peer_id for n in swarm.nodes])
        with httpx.Client(timeout=10.0) as client:
            for url in urls:
                try:
                    status = client.get(url + "/status").json()
                    peers = status["peers"]
                    speed = status["load"]["prefill_ms_per_token"]
                except (httpx.HTTPError, ValueError, KeyError, TypeError):
                    continue
                run.peer_rtt_ms += [p["rtt_ms"] for p in peers if p.get("rtt_ms") is not None]
                run.prefill_ms_per_token.append(speed)
    except BaseException:
        swarm.__exit__(None, None, None)
        raise
    if keep:
        run.kept_swarm = swarm
    else:
        swarm.__exit__(None, None, None)
    return run


def summarise(run: PolicyRun) -> dict[str, Any]:
    ok = [o for o in run.outcomes if o.ok]
    ttft = [o.ttft_ms for o in ok if o.ttft_ms is not None]
    prompt = sum(o.prompt_tokens for o in ok)
    reused = sum(o.reused for o in ok)
    forwarded = [o for o in ok if (o.hops or 0) > 0]
    predicted_fw = sum(o.predicted for o in forwarded)
    realised_fw = sum(o.reused for o in forwarded)
    predicted_all = sum(o.predicted for o in ok)
    timed = [o for o in ok if o.engine_prefill_ms is not None]
    served = {pid: 0 for pid in run.node_peer_ids}
    for o in ok:
        if o.served_by in served:
            served[o.served_by] += 1
    return {
        "policy": run.policy,
        "requests": len(run.outcomes),
        "completed": len(ok),
        "failed": len(run.outcomes) - len(ok),
        "ttft_ms": {
            "mean": round(statistics.fmean(ttft), 1) if ttft else None,
            "p50": round(percentile(ttft, 50), 1) if ttft else None,
            "p99": round(percentile(ttft, 99), 1) if ttft else None,
        },
        "hit_rate": round(reused / prompt, 4) if prompt else 0.0,
        "forwarded_share": round(len(forwarded) / len(ok), 4) if ok else 0.0,
        "prediction_accuracy": round(realised_fw / predicted_fw, 4) if predicted_fw else None,
        "prediction_accuracy_all": round(min(reused, predicted_all) / predicted_all, 4) if predicted_all else None,
        "served_per_node": list(served.values()),
        "wall_s": round(run.wall_s, 2),
        "peer_rtt_ms_median": round(statistics.median(run.peer_rtt_ms), 3) if run.peer_rtt_ms else None,
        "prefill_ms_per_token_nodes": [round(x, 3) for x in run.prefill_ms_per_token],
        # Where the live time went: waiting for the serving engine, then its prefill.
        "engine_queue_ms_mean": round(statistics.fmean(o.engine_queue_ms or 0.0 for o in timed), 1) if timed else None,
        "engine_prefill_ms_mean": round(statistics.fmean(o.engine_prefill_ms or 0.0 for o in timed), 1) if timed else None,
        "errors": sorted({o.error or f"HTTP {o.status}" for o in run.outcomes if not o.ok})[:5],
    }


def mmlu_live_requests(
    n: int, nodes: int, *, subjects: Sequence[str] | None = None, max_subjects: int = 4, seed: int = 1,
    max_tokens: int = 1, zipf_s: float = 0.0,
) -> tuple[list[LiveRequest], dict[str, Any]]:
    """MMLU five-shot prompts (packaged subset) with random entry nodes."""
    from ..workloads.base import Popularity
    from ..workloads.mmlu import MMLUWorkload, five_shot_header, load_mmlu

    all_subjects = load_mmlu()
    if subjects:
        wanted = set(subjects)
        chosen = [s for s in all_subjects if s.name in wanted]
        missing = wanted - {s.name for s in chosen}
        if missing:
            raise ValueError(f"unknown MMLU subjects: {', '.join(sorted(missing))}")
    else:
        # The subjects with the shortest five-shot headers keep a CPU demo quick.
        chosen = sorted(all_subjects, key=lambda s: len(five_shot_header(s)))[:max_subjects]
    workload = MMLUWorkload(chosen, Popularity("zipf", zipf_s) if zipf_s else None, seed=seed, output_tokens=max_tokens)
    rng = random.Random(seed)
    out = []
    for prompt in workload.prompts(n, rng):
        out.append(LiveRequest(prompt.label, "".join(prompt.parts), max_tokens, rng.randrange(nodes)))
    meta = {"subjects": [s.name for s in chosen], "header_chars": [len(five_shot_header(s)) for s in chosen]}
    return out, meta


OUTCOME_FIELDS = (
    "entry", "ok", "ttft_ms", "served_by", "hops", "prompt_tokens", "predicted", "reused",
    "engine_queue_ms", "engine_prefill_ms", "sent_s",
)
"""What a saved run keeps of each request: enough to replay it in the simulator."""


def outcomes_json(run: PolicyRun) -> list[dict[str, Any]]:
    """Per request, in request order (see :data:`OUTCOME_FIELDS`)."""
    return [{k: v for k, v in asdict(o).items() if k in OUTCOME_FIELDS} for o in run.outcomes]
