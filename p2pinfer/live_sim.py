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

__all__ = ["fit_engine_timing", "full_speed_work", "live_cost_model", "simulate_live_run"]

MIN_FIT_SAMPLES = 8


def fit_engine_timing(
    samples: Sequence[tuple[int, int, float]], base: EngineCostModel | None = None, what: str = "engine timings"
) -> EngineCostModel | None:
    """Fit ``overhead + hit x restore + new tokens x ms/token`` to what the
    serving engines measured: (prompt tokens, reused tokens, engine ms from
    the start of prefill to the first token) per request.

    That is the simulator's engine model, fitted on the live run itself, so
    it carries the run's real CPU contention (nodes sharing cores) on
    average. ``None`` when there are too few samples or the fit is not
    physical (a negative slope).
    """
    import numpy as np

    rows = [(1.0, 1.0 if reused else 0.0, float(max(1, prompt - reused)), ms) for prompt, reused, ms in samples if ms > 0]
    if len(rows) < MIN_FIT_SAMPLES:
        return None
    a = np.array([r[:3] for r in rows])
    y = np.array([r[3] for r in rows])
    if len({r[1] for r in rows}) == 1:  # all hits or all misses: restore cannot be told apart
        a = a[:, [0, 2]]
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    overhead = float(coef[0])
    per_token = float(coef[-1])
    restore = float(coef[1]) if a.shape[1] == 3 else 0.0
    if per_token <= 0:
        return None
    base = base or EngineCostModel()
    return EngineCostModel(
        prefill_ms_per_token=round(per_token, 4),
        decode_ms_per_token=round(base.decode_ms_per_token * per_token / base.prefill_ms_per_token, 4),
        cache_hit_overhead_ms=round(max(0.0, restore), 3),
        request_overhead_ms=round(max(0.0, overhead), 3),
        source=f"least-squares fit of {len(rows)} {what} of the live run "
        f"(overhead {overhead:.1f} ms, restore {restore:.1f} ms, {per_token:.2f} ms/token); decode scaled alike",
    )


def full_speed_work(intervals: Sequence[tuple[float, float]], cores: float) -> list[float]:
    """Seconds of full-speed work in each (start, end) engine interval, when
    every interval ran on one machine of ``cores`` cores shared by all.

    While k intervals overlap, each progresses at ``min(1, cores / k)``
    (the simulator's processor-sharing model, ``sim/cpu.py``), so a prefill
    that took 2 s while four nodes computed on two cores was 1 s of work.
    """
    points = sorted({t for iv in intervals for t in iv})
    # Busy count on each elementary segment between consecutive time points.
    delta: dict[float, int] = {}
    for a, b in intervals:
        delta[a] = delta.get(a, 0) + 1
        delta[b] = delta.get(b, 0) - 1
    rate_at: dict[float, float] = {}
    busy = 0
    for t in points:
        busy += delta.get(t, 0)
        rate_at[t] = min(1.0, cores / busy) if busy > 0 else 1.0
    index = {t: i for i, t in enumerate(points)}
    work = []
    for a, b in intervals:
        i, j = index[a], index[b]
        work.append(sum((points[k + 1] - points[k]) * rate_at[points[k]] for k in range(i, j)))
    return work


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
    shared_cores: float = 0.0,
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
        warmup=0.0, seed=seed, shared_cores=shared_cores,
    )
    info = {"kind": "replay of a live bench swarm run", "requests": len(timed)}
    result = Simulator(config, timed, _encoder("auto"), workload=info).run()
    return {
        "ttft_ms": result["ttft_ms"],
        "hit_rate": result["hit_rate"],
        "forwarded_share": result["forwarded_share"],
        "one_way_ms": one_way_ms,
        "shared_cores": shared_cores or None,
        "cost_model": cost.as_dict(),
        "tokenizer": result.get("tokenizer"),
    }
