"""The simulator's prediction for a live swarm run, on the same requests.

``p2pinfer bench swarm`` drives real nodes with a closed loop (a fixed
number of requests in flight). To compare the simulator with the live
swarm setting for setting, this module replays the same requests (prompt
text, entry node, order) through :class:`~p2pinfer.sim.simulator.Simulator`
with the same client loop, node count, cache budget and measured delay,
and an engine model fitted to the live engines' own timings. What differs
is then the model, not the workload.
"""

from __future__ import annotations

from collections.abc import Sequence
import statistics
from typing import Any

from ..core.costmodel import EngineCostModel
from .live_bench import LiveRequest

__all__ = ["fit_engine_timing", "full_speed_work", "live_cost_model", "predict_live_run", "simulate_live_run"]

MIN_FIT_SAMPLES = 8


def fit_engine_timing(
    samples: Sequence[tuple[int, int, float]], base: EngineCostModel | None = None, what: str = "engine timings"
) -> EngineCostModel | None:
    """Fit ``overhead + hit x restore + new tokens x ms/token`` to what the
    serving engines measured: (prompt tokens, reused tokens, engine ms from
    the start of prefill to the first token) per request.

    That is the simulator's engine model, fitted on the live run itself, so
    it carries the run's real CPU contention (nodes sharing cores) on
    average. ``None`` when there are too few samples or no fit has every
    term non-negative.
    """
    try:
        import numpy as np
    except ImportError:
        raise RuntimeError("fitting engine timings needs numpy: pip install 'p2pinfer[lab]'") from None

    rows = [(1.0, 1.0 if reused else 0.0, float(max(1, prompt - reused)), ms) for prompt, reused, ms in samples if ms > 0]
    if len(rows) < MIN_FIT_SAMPLES:
        return None
    full = np.array([r[:3] for r in rows])
    y = np.array([r[3] for r in rows])
    # Least squares with every term non-negative: drop a term that comes out
    # negative and fit again (clamping it instead would shift every prediction).
    for cols in ([0, 1, 2], [0, 2]):
        if 1 in cols and len(set(full[:, 1])) == 1:
            continue  # all hits or all misses: restore cannot be told apart from the overhead
        coef, *_ = np.linalg.lstsq(full[:, cols], y, rcond=None)
        terms = dict(zip(cols, (float(c) for c in coef)))
        if all(v >= 0 for v in terms.values()):
            break
    else:
        return None
    overhead, restore, per_token = terms.get(0, 0.0), terms.get(1, 0.0), terms.get(2, 0.0)
    if per_token <= 0:
        return None
    base = base or EngineCostModel()
    return EngineCostModel(
        prefill_ms_per_token=round(per_token, 4),
        decode_ms_per_token=round(base.decode_ms_per_token * per_token / base.prefill_ms_per_token, 4),
        cache_hit_overhead_ms=round(restore, 3),
        request_overhead_ms=round(overhead, 3),
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
    *,
    policy: str,
    nodes: int,
    cache_tokens: int,
    one_way_ms: float,
    cost: EngineCostModel,
    concurrency: int,
    seed: int = 1,
    shared_cores: float = 0.0,
    slots: int = 1,
) -> dict[str, Any]:
    """Simulate ``requests`` sent in order to their entry nodes by a client
    that keeps ``concurrency`` in flight, as ``bench swarm``'s does, on
    nodes of ``slots`` slots each (the live nodes' ``slots_per_node``).

    A closed loop, not the live send times: replaying those open-loop would
    feed a slightly slower model more work than it can serve, and its
    queues would grow without bound.
    """
    from ..sim.simulator import SimConfig, Simulator
    from ..workloads import PromptEncoder, load_tokenizer
    from ..workloads.base import Prompt, TimedRequest

    if not requests:
        raise ValueError("no requests to replay")
    timed = [TimedRequest(0.0, Prompt(r.label, (r.prompt,), output_tokens=r.max_tokens), entry=r.entry) for r in requests]
    config = SimConfig(
        nodes=nodes, policy=policy, latency=f"{one_way_ms:g}", cache_tokens=cache_tokens, cost=cost,
        warmup=0.0, seed=seed, shared_cores=shared_cores, concurrency=concurrency, slots=slots,
    )
    info = {"kind": "replay of a live bench swarm run", "requests": len(timed)}
    result = Simulator(config, timed, PromptEncoder(load_tokenizer("auto")), workload=info).run()
    return {
        "ttft_ms": result["ttft_ms"],
        "hit_rate": result["hit_rate"],
        "forwarded_share": result["forwarded_share"],
        "load": result["load"],
        "one_way_ms": one_way_ms,
        "shared_cores": shared_cores or None,
        "concurrency": concurrency,
        "slots_per_node": slots,
        "cost_model": cost.as_dict(),
    }


def predict_live_run(
    requests: Sequence[LiveRequest],
    outcomes: Sequence[dict[str, Any]],
    *,
    policy: str,
    nodes: int,
    cache_tokens: int,
    concurrency: int,
    rtt_ms: float | None,
    prefill_estimates: Sequence[float] = (),
    cores: float | None = None,
    seed: int = 1,
    slots: int = 1,
) -> dict[str, Any]:
    """The simulator's prediction for one live policy run, from its outcomes
    (``bench swarm``'s per-request records, live or read back from its JSON).

    Two models: every node on ``cores`` shared cores (what a local swarm
    is), the engine fitted as full-speed work; and, for contrast, one
    machine per node, the engine fitted on the raw timings (which carry the
    run's average contention). One-way delay: half the median ping RTT.
    """
    import os

    cores = float(cores or os.cpu_count() or 1)
    one_way = rtt_ms / 2 if rtt_ms else 0.0
    done = [o for o in outcomes if o.get("ok") and o.get("engine_prefill_ms") is not None and o.get("ttft_ms") is not None]
    fallback = live_cost_model(prefill_estimates)
    # Engine intervals on the client's clock: the first token left the engine just before the client got it.
    ends = [o["sent_s"] + o["ttft_ms"] / 1000 for o in done]
    intervals = [(e - o["engine_prefill_ms"] / 1000, e) for e, o in zip(ends, done)]
    work = full_speed_work(intervals, cores)
    shared_cost = fit_engine_timing(
        [(o["prompt_tokens"], o["reused"], w * 1000) for o, w in zip(done, work)],
        what=f"engine timings, as full-speed work on {cores:g} shared cores,",
    ) or fallback
    apart_cost = fit_engine_timing([(o["prompt_tokens"], o["reused"], o["engine_prefill_ms"]) for o in done]) or fallback
    common = dict(
        policy=policy, nodes=nodes, cache_tokens=cache_tokens, one_way_ms=one_way, concurrency=concurrency, seed=seed,
        slots=slots,
    )
    shared = simulate_live_run(requests, cost=shared_cost, shared_cores=cores, **common)  # type: ignore[arg-type]
    apart = simulate_live_run(requests, cost=apart_cost, **common)  # type: ignore[arg-type]
    ttft = [o["ttft_ms"] for o in outcomes if o.get("ok") and o.get("ttft_ms") is not None]
    live_mean = sum(ttft) / len(ttft) if ttft else None
    for sim in (shared, apart):
        mean = sim["ttft_ms"]["mean"]
        sim["live_over_simulated_mean_ttft"] = round(live_mean / mean, 3) if live_mean and mean else None
    shared["one_machine_per_node"] = apart
    return shared
