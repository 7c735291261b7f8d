"""``p2pinfer bench overlay``: what the overlay itself costs, on loopback.

Nodes are separate processes (``p2pinfer.lab.scripted_node``) running the
simulated engine at zero cost, so every millisecond measured is overlay:
libp2p, framing, protobuf, routing. Three figures:

* added latency of a forwarded request over a local one, both entering at
  node A and timed inside A (interleaved, so they share the machine's state);
* time for a cache change on one node to appear in another's view, timed
  with CLOCK_MONOTONIC (shared by all processes of the machine) and compared
  with the gossip intervals;
* gossip bytes per node per second, idle and at a stated request rate.
"""

from __future__ import annotations

import os
import platform
import random
import statistics
import time
from typing import Any

from ..core.blocks import DEFAULT_BLOCK_SIZE
from ..stats import percentile


def _summary(values: list[float], digits: int = 3) -> dict[str, float]:
    return {
        "p50": round(statistics.median(values), digits),
        "p90": round(percentile(values, 90), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
    }


def run_overlay_bench(
    nodes: int = 3,
    forwards: int = 200,
    prompt_tokens: int = 256,
    max_tokens: int = 1,
    propagation_samples: int = 30,
    rate: float = 20.0,
    load_seconds: float = 10.0,
    idle_seconds: float = 5.0,
    seed: int = 1,
) -> dict[str, Any]:
    from importlib.metadata import version

    from ..core.router import GossipConfig

    rng = random.Random(seed)
    gossip = GossipConfig()  # the defaults a real swarm runs with
    procs = _start_swarm(nodes, gossip)
    try:
        forward = _forward_phase(procs, rng, forwards, prompt_tokens, max_tokens)
        propagation = _propagation_phase(procs, rng, gossip, propagation_samples)
        idle, loaded = _gossip_volume_phase(procs, rng, idle_seconds, load_seconds, rate, prompt_tokens, max_tokens)
        final = [p.call("status")["counters"] for p in procs]
        return {
            "benchmark": "overlay",
            "nodes": nodes,
            "engine": "simulated speed=0 (zero cost)",
            "transport": "TCP loopback, Noise, Yamux; one process per node",
            "gossip": {
                "delta_interval_s": gossip.delta_interval_s,
                "full_interval_s": gossip.full_interval_s,
                "load_interval_s": gossip.load_interval_s,
            },
            "forward": forward,
            "propagation": propagation,
            "gossip_idle": idle,
            "gossip_loaded": loaded,
            "gossip_bytes_note": "signed pubsub messages (data, topic, ids, signature); gossipsub control traffic (IHAVE/IWANT/GRAFT) and relaying copies not included",
            "requests_failed": sum(c["requests_failed"] for c in final),
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "libp2p": version("libp2p")},
        }
    finally:
        for p in procs:
            p.close()


def _fresh(rng: random.Random, n: int) -> list[int]:
    """``n`` token ids no earlier request used (with overwhelming probability)."""
    return [rng.randrange(256, 49152) for _ in range(n)]


def _start_swarm(nodes: int, gossip: Any) -> list[Any]:
    """``nodes`` node processes (zero-cost simulated engine) bootstrapped from the first, every view complete."""
    from ..core.router import RouterConfig
    from ..net.config import NodeConfig
    from .node_process import NodeProcess, wait_until

    def config(bootstrap: tuple[str, ...]) -> NodeConfig:
        return NodeConfig(
            listen=("/ip4/127.0.0.1/tcp/0",),
            bootstrap=bootstrap,
            engine="simulated",
            engine_options={"speed": 0.0},
            router=RouterConfig(gossip=gossip),
        )

    procs: list[NodeProcess] = []
    try:
        first = NodeProcess(config(()), "bench-0")
        procs.append(first)
        for i in range(1, nodes):
            procs.append(NodeProcess(config((first.addr,)), f"bench-{i}"))
        ids = [p.peer_id for p in procs]

        def everyone_sees_everyone() -> bool:
            for p in procs:
                view = p.call("view")
                if any(not view.get(other, {}).get("eligible") for other in ids if other != p.peer_id):
                    return False
            return True

        wait_until(everyone_sees_everyone, 60, interval_s=0.2, what="full view")
    except BaseException:
        for p in procs:
            p.close()
        raise
    return procs


def _forward_phase(procs: list[Any], rng: random.Random, forwards: int, prompt_tokens: int,
                   max_tokens: int) -> dict[str, Any]:
    """Forwarded against local, interleaved, both entering at A and timed inside A."""
    a, b = procs[0], procs[1]
    prompt = _fresh(rng, prompt_tokens)
    for _ in range(10):  # warm-up: connection, stream pool, caches
        a.call("generate", tokens=prompt, max_tokens=max_tokens, prefer=b.peer_id)
        a.call("generate", tokens=prompt, max_tokens=max_tokens, prefer="local")
    local_ms: list[float] = []
    fwd_ms: list[float] = []
    local_ttft: list[float] = []
    fwd_ttft: list[float] = []
    for _ in range(forwards):
        r = a.call("generate", tokens=prompt, max_tokens=max_tokens, prefer="local")
        local_ms.append(r["total_s"] * 1000)
        local_ttft.append(r["ttft_s"] * 1000)
        r = a.call("generate", tokens=prompt, max_tokens=max_tokens, prefer=b.peer_id)
        if r["served_by"] != b.peer_id:
            raise RuntimeError(f"forward was not served by B: {r['reason']}")
        fwd_ms.append(r["total_s"] * 1000)
        fwd_ttft.append(r["ttft_s"] * 1000)
    added = [f - loc for f, loc in zip(fwd_ms, local_ms)]
    return {
        "requests_each": forwards,
        "prompt_tokens": prompt_tokens,
        "max_tokens": max_tokens,
        "local_ms": _summary(local_ms),
        "forwarded_ms": _summary(fwd_ms),
        "local_ttft_ms": _summary(local_ttft),
        "forwarded_ttft_ms": _summary(fwd_ttft),
        "added_ms_p50": round(statistics.median(fwd_ms) - statistics.median(local_ms), 3),
        "added_ms_pairwise": _summary(added),
        "target_added_ms_p50": 3.0,
        "rtt_ms_in_view": a.call("view")[b.peer_id]["rtt_ms"],
    }


def _propagation_phase(procs: list[Any], rng: random.Random, gossip: Any, samples: int) -> dict[str, Any]:
    """A cache change on B, timed until it shows in every other node's view (CLOCK_MONOTONIC)."""
    from ..core.blocks import BlockHasher
    from ..engines.simulated import SimulatedEngine

    b = procs[1]
    hasher = BlockHasher(SimulatedEngine().fingerprint)
    watchers = [p for p in procs if p is not b]
    delays: list[float] = []
    for _ in range(samples):
        time.sleep(rng.uniform(0.0, gossip.delta_interval_s * 2))  # random phase
        tokens = _fresh(rng, 64)
        last_block = hasher.hashes(tokens)[-1]
        waits = [w.start_call("wait_hash", peer=b.peer_id, hash=last_block, timeout_s=30.0) for w in watchers]
        done = b.call("generate", tokens=tokens, max_tokens=1, prefer="local")
        for wait in waits:
            delays.append((wait(40) - done["done_at"]) * 1000)
    return {
        "samples": len(delays),
        "delay_ms": _summary(delays, 1),
        "delta_interval_ms": gossip.delta_interval_s * 1000,
        "full_interval_ms": gossip.full_interval_s * 1000,
        "p50_over_delta_interval": round(statistics.median(delays) / (gossip.delta_interval_s * 1000), 3),
        "max_over_delta_interval": round(max(delays) / (gossip.delta_interval_s * 1000), 3),
    }


def _gossip_volume(before: list[dict[str, Any]], after: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    pub = [(y["gossip_published_bytes"] - x["gossip_published_bytes"]) / seconds for x, y in zip(before, after)]
    rec = [(y["gossip_received_bytes"] - x["gossip_received_bytes"]) / seconds for x, y in zip(before, after)]
    msgs = [(y["gossip_published"] - x["gossip_published"]) / seconds for x, y in zip(before, after)]
    return {
        "seconds": round(seconds, 2),
        "published_bytes_per_node_per_s": round(statistics.fmean(pub), 1),
        "received_bytes_per_node_per_s": round(statistics.fmean(rec), 1),
        "published_msgs_per_node_per_s": round(statistics.fmean(msgs), 2),
        "max_received_bytes_per_node_per_s": round(max(rec), 1),
    }


def _gossip_volume_phase(procs: list[Any], rng: random.Random, idle_seconds: float, load_seconds: float,
                         rate: float, prompt_tokens: int, max_tokens: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Gossip per node per second while idle, then at ``rate`` requests per second of new prompts."""
    def counters() -> list[dict[str, Any]]:
        return [p.call("status")["counters"] for p in procs]

    c0 = counters()
    t0 = time.monotonic()
    time.sleep(idle_seconds)
    idle = _gossip_volume(c0, counters(), time.monotonic() - t0)

    c0 = counters()
    t0 = time.monotonic()
    pending = []
    sent = 0
    while (now := time.monotonic() - t0) < load_seconds:
        due = int(now * rate)
        while sent < due:
            node = procs[sent % len(procs)]
            pending.append(node.start_call("generate", tokens=_fresh(rng, prompt_tokens), max_tokens=max_tokens))
            sent += 1
        time.sleep(0.005)
    for wait in pending:
        wait(60)
    elapsed = time.monotonic() - t0
    loaded = _gossip_volume(c0, counters(), elapsed)
    loaded.update(
        {
            "request_rate_per_s": round(sent / elapsed, 2),
            "new_tokens_per_request": prompt_tokens,
            "new_blocks_per_request": prompt_tokens // DEFAULT_BLOCK_SIZE,
        }
    )
    return idle, loaded
