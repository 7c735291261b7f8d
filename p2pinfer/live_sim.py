"""The simulator's prediction for a live swarm run, on the same arrivals.

``p2pinfer bench swarm`` drives real nodes with a closed loop (a fixed
number of requests in flight), so each policy sees its own arrival times.
To compare the simulator with the live swarm setting for setting, this
module replays exactly those arrivals (time sent, entry node, prompt text)
through :class:`~p2pinfer.sim.simulator.Simulator` with the live run's
node count, cache budget, measured one-way delay and the nodes' own
prefill-speed estimates. What differs is then the model, not the workload.
"""

from __future__ import annotations

from collections.abc import Sequence
import statistics
from typing import Any

from .core.costmodel import EngineCostModel
from .live_bench import LiveRequest

__all__ = ["live_cost_model", "simulate_live_run"]


def live_cost_model(prefill_ms_per_token: Sequence[float], base: EngineCostModel | None = None) -> EngineCostModel:
    """The default engine model with the live nodes' median prefill speed.

    Decode, restore and request overheads keep their calibrated values: the
    benchmark generates one token, so they matter little.
    """
    base = base or EngineCostModel()
    speeds = [s for s in prefill_ms_per_token if s and s > 0]
    if not speeds:
        return base
    prefill = statistics.median(speeds)
    return EngineCostModel(
        prefill_ms_per_token=prefill,
        decode_ms_per_token=base.decode_ms_per_token * prefill / base.prefill_ms_per_token,
        cache_hit_overhead_ms=base.cache_hit_overhead_ms,
        request_overhead_ms=base.request_overhead_ms,
        source=f"live nodes' own prefill estimates (median of {len(speeds)}: {prefill:.2f} ms/token), "
        f"decode scaled alike",
    )


def simulate_live_run(
    requests: Sequence[LiveRequest],
    sent_s: Sequence[float],
    *,
    policy: str,
    nodes: int,
    cache_tokens: int,
    one_way_ms: float,
    cost: EngineCostModel,
    seed: int = 1,
) -> dict[str, Any]:
    """Simulate ``requests`` arriving at ``sent_s`` at their entry nodes."""
    from .sim.runner import _encoder
    from .sim.simulator import SimConfig, Simulator
    from .workloads.base import Prompt, TimedRequest

    if len(requests) != len(sent_s):
        raise ValueError("one send time per request")
    timed = [
        TimedRequest(t, Prompt(r.label, (r.prompt,), output_tokens=r.max_tokens), entry=r.entry)
        for r, t in sorted(zip(requests, sent_s), key=lambda p: p[1])
    ]
    config = SimConfig(
        nodes=nodes, policy=policy, latency=f"{one_way_ms:g}", cache_tokens=cache_tokens, cost=cost,
        warmup=0.0, seed=seed,
    )
    info = {"kind": "replay of a live bench swarm run", "requests": len(timed)}
    result = Simulator(config, timed, _encoder("auto"), workload=info).run()
    return {
        "ttft_ms": result["ttft_ms"],
        "hit_rate": result["hit_rate"],
        "forwarded_share": result["forwarded_share"],
        "one_way_ms": one_way_ms,
        "cost_model": cost.as_dict(),
        "tokenizer": result.get("tokenizer"),
    }
