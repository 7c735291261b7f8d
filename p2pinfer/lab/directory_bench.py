"""``p2pinfer bench directory``: gossip against the prefix directory, live, by swarm size.

For each node count N and each discovery mode (``gossip``, ``directory``),
on the *same* requests: N node processes (``p2pinfer.lab.scripted_node``,
the simulated engine at its calibrated cost, the defaults of ``p2pinfer
node --engine simulated`` except ``discovery``) on TCP loopback, bootstrapped
from the first. Once every view (and, with the directory, every placement)
is complete:

1. an idle window (no requests): CPU per node from ``/proc`` as a fraction of
   one core, resident memory, inbound TCP bytes per node (``measure_swarm``
   of :mod:`.idle_bench`);
2. a workload window: MMLU five-shot prompts (token ids of the approximate
   tokenizer the simulated engine uses), Poisson arrivals at ``rate`` per
   second, each at a random node; inbound TCP bytes per node per second
   (mean, p99 and busiest over nodes: directory streams, load and digest
   gossip, gossipsub control, KadDHT, pings, pulls, and the forwarded
   requests themselves, all of it), CPU per request, hit rate (reused over
   prompt tokens), mean and p99 TTFT;
3. the simulator's prediction for the same requests, arrivals and entries
   (``sim_*``): same node count, discovery, directory settings (KadDHT
   placement, its own traffic counted), gossip schedule (load reports on the
   model's one topic with gossip, in hashed load topics with the directory, as
   the live node sends them) and engine cost model, 0.1 ms
   one-way links, and the nodes' answer checks (``sim/answer_checks.py``:
   the entry holds a new peer's first answers until its own engine has
   checked them, and spot-checks the others), with ``check_cache`` as the
   nodes run it. ``sim_ttft_ms_mean_without_checks`` is the same swarm with
   no checks, and the forwarded requests' TTFT is reported apart by whether
   their answer was held.

The nodes run with ``check_cache`` off by default (``--check-cache`` turns it
on, the product default, and the simulator follows): an entry that keeps the
prompts it checks serves later requests of those subjects itself.
``--no-verify`` turns answer checks off (no probation, no spot checks): the
control run that shows what the checks cost. ``--sim-only`` runs only the
simulator's side (seconds): the prediction for the same seeds and settings.

TTFT here is the engine's, plus queueing and the forward: the simulated
engine sleeps its modelled time, so a loaded machine changes little of it,
but the processes' own work (routing, lookups, streams) is real.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
import random
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from ..core.costmodel import EngineCostModel
from .idle_bench import IdleSwarm, cpu_seconds, measure_swarm
from .tcp_meter import TcpByteMeter
from ..stats import mean, percentile, rounded
from ..provenance import with_provenance

__all__ = ["run_directory_bench"]

MODES = ("gossip", "directory")


def bench_engine_options(check_cache: bool) -> dict[str, Any]:
    """Every node's engine options: the product default with ``check_cache``, else that one off."""
    from .node_process import NO_CHECK_CACHE

    return {} if check_cache else dict(NO_CHECK_CACHE)


def bench_verify(verify: bool) -> Any:
    """Every node's answer checks: None (the product default) or none at all (``--no-verify``:
    no probation, no spot checks), the swarm the simulator models."""
    from ..core.verify import VerifyConfig

    return None if verify else VerifyConfig(fraction=0.0, probation_answers=0)


def build_workload(n_nodes: int, requests: int, rate: float, seed: int, popularity: str = "zipf:1") -> tuple[list[Any], Any]:
    """The MMLU five-shot requests (token ids), their arrivals and entries, and the encoder."""
    from ..workloads.base import PromptEncoder, TimedRequest, parse_popularity, poisson_arrivals
    from ..workloads.mmlu import MMLUWorkload, load_mmlu
    from ..workloads.tokenizer import load_tokenizer

    encoder = PromptEncoder(load_tokenizer("approx"))
    work = MMLUWorkload(load_mmlu(), parse_popularity(popularity), seed=seed, output_tokens=4)
    rng = random.Random(f"directory-bench-{seed}")
    times = poisson_arrivals(requests, rate, rng)
    out = []
    for t in times:
        p = work.draw(rng)
        tokens = tuple(encoder.encode(p))
        out.append(TimedRequest(t, replace(p, tokens=tokens), rng.randrange(n_nodes)))
    return out, encoder


def ttft_by_path(results: list[dict[str, Any]]) -> dict[str, float | None]:
    """Mean TTFT (ms) of the requests served where they entered, of the forwarded ones, and of
    the forwarded ones split by whether the entry held the answer for a check (a new peer's
    probation): the simulator models no checking, so the held ones are where the two part."""
    def ttft_mean(rs: list[dict[str, Any]]) -> float | None:
        return rounded(mean(r["ttft_s"] * 1000.0 for r in rs), 1)

    forwarded = [r for r in results if not r["served_locally"]]
    was_held = [any(a.get("held_tokens") for a in r.get("attempts", [])) for r in forwarded]
    held = [r for r, h in zip(forwarded, was_held) if h]
    return {
        "ttft_ms_mean_served_locally": ttft_mean([r for r in results if r["served_locally"]]),
        "ttft_ms_mean_forwarded": ttft_mean(forwarded),
        "ttft_ms_mean_forwarded_held": ttft_mean(held),
        "ttft_ms_mean_forwarded_unheld": ttft_mean([r for r, h in zip(forwarded, was_held) if not h]),
        "forwarded_held": len(held),
    }


def _wait_directory(swarm: IdleSwarm, n: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if all(p.call("directory", timeout_s=60)["members"] == n for p in swarm.procs):
                return True
        except Exception:
            pass
        time.sleep(1.0)
    return False


def _drive(swarm: IdleSwarm, reqs: list[Any]) -> tuple[list[dict[str, Any]], list[str], float]:
    """Send every request at its arrival time; returns results, errors and the window length."""
    results: list[dict[str, Any]] = []
    errors: list[str] = []
    lock = threading.Lock()
    t0 = time.monotonic()

    def one(req: Any) -> None:
        time.sleep(max(0.0, t0 + req.t - time.monotonic()))
        node = swarm.procs[req.entry]
        try:
            r = node.call("generate", timeout_s=300, tokens=list(req.prompt.tokens), max_tokens=req.prompt.output_tokens)
        except Exception as exc:
            with lock:
                errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
            return
        with lock:
            results.append(r)

    with ThreadPoolExecutor(max(4, min(64, len(reqs)))) as pool:
        list(pool.map(one, reqs))
    return results, errors, time.monotonic() - t0


def sim_verify(verify: bool) -> Any:
    """What the simulator models of the nodes' answer checks: the node default's
    (``RouterConfig().verify``), or none (``--no-verify``)."""
    from ..core.router import RouterConfig

    return RouterConfig().verify if verify else None


def simulate(n: int, mode: str, reqs: list[Any], encoder: Any, seed: int, *, verify: Any = None,
             check_cache: bool = False) -> dict[str, Any]:
    from ..core.router import GossipConfig
    from ..net.config import LIVE_DIRECTORY, NodeConfig
    from ..sim.model import SimConfig
    from ..sim.simulator import Simulator

    # As the live node: with gossip every report on the model's one topic (topic_size = n); with
    # the directory in its hashed load topics of about NodeConfig.load_topic_nodes.
    topic_size = NodeConfig().load_topic_nodes if mode == "directory" else n
    config = SimConfig(
        nodes=n, discovery=mode, directory=LIVE_DIRECTORY, gossip=GossipConfig(), cost=EngineCostModel(),
        cache_tokens=200_000, latency="0.1", warmup=0.0, seed=seed, topic_size=topic_size, load_topics="hash",
        verify=verify, check_cache=check_cache,
    )
    return Simulator(config, reqs, encoder, workload={"kind": "mmlu", "requests": len(reqs)}).run()


def predict(n: int, mode: str, reqs: list[Any], encoder: Any, seed: int, *, verify: bool, check_cache: bool) -> dict[str, Any]:
    """The simulator's figures for one live run (``sim_*``): the same requests, with the
    nodes' answer checks when they check; without them too, to show what the checks cost."""
    sim = simulate(n, mode, reqs, encoder, seed, verify=sim_verify(verify), check_cache=check_cache)
    out: dict[str, Any] = {
        "sim_ttft_ms_mean": sim["ttft_ms"]["mean"],
        "sim_ttft_ms_p99": sim["ttft_ms"]["p99"],
        "sim_hit_rate": sim["hit_rate"],
        "sim_bytes_in_per_node_per_s": sim.get("gossip_bytes_per_node_per_s"),
    }
    disc = sim.get("discovery") or {}
    out["sim_bytes_in_per_node_per_s_p99"] = disc.get("in_bytes_per_s_node_p99")
    out["sim_bytes_in_busiest_node_per_s"] = disc.get("in_bytes_per_s_node_max")
    out["sim_bytes_in_by_kind"] = disc.get("in_bytes_per_node_per_s_by_kind")
    out["sim_bytes_note"] = "discovery traffic only (gossip, directory streams, KadDHT): no forwarded requests or answers"
    wait = sim.get("decision_wait_ms") or {}
    out["sim_decision_ms_mean"] = round(sim["decision_us_p50"] / 1000.0 + wait.get("mean", 0.0), 2)
    out["sim_decision_note"] = "the simulator's own decision CPU time (p50, wall clock) plus the lookup's mean round trip (virtual)"
    checks = sim.get("answer_checks")
    if checks is not None:
        out["sim_forwarded_held"] = checks["forwarded_held"]
        out["sim_ttft_ms_mean_forwarded_held"] = checks["ttft_ms_mean_forwarded_held"]
        out["sim_ttft_ms_mean_forwarded_unheld"] = checks["ttft_ms_mean_forwarded_unheld"]
        out["sim_check_counts"] = checks["counts"]
        out["sim_checks_note"] = "the simulator models the node default's checks (sim/answer_checks.py); " + checks["not_modelled"]
        bare = simulate(n, mode, reqs, encoder, seed, verify=None)
        out["sim_ttft_ms_mean_without_checks"] = bare["ttft_ms"]["mean"]
    return out


def run_once(n: int, mode: str, reqs: list[Any], encoder: Any, *, idle_s: float, settle_s: float, seed: int,
             log_dir: Path | None, say: Any, check_cache: bool = False, verify: bool = True) -> dict[str, Any]:
    say(f"{n} nodes, {mode}: starting")
    started = time.monotonic()
    meter: TcpByteMeter | None = None
    swarm = IdleSwarm(n, log_dir=log_dir, discovery=mode, engine_options=bench_engine_options(check_cache),
                      verify=bench_verify(verify))
    try:
        converged = swarm.wait_complete(180)
        settled: dict[str, Any] = {"views_complete_after_s": None if converged is None else round(converged, 1)}
        if converged is None:
            # Measured anyway, and said so: how far the views got is a result too.
            settled["views_eligible_share"] = swarm.eligible_share()
            say(f"{n} nodes, {mode}: views not complete after 180 s ({settled['views_eligible_share']} of pairs eligible)")
        if mode == "directory":
            settled["placements_complete"] = _wait_directory(swarm, n, 60)
        time.sleep(settle_s)
        say(f"{n} nodes, {mode}: idle window")
        idle = measure_swarm(swarm, idle_s)
        pids = swarm.pids
        meter = TcpByteMeter(pids).start()
        cpu0 = [cpu_seconds(p) for p in pids]
        say(f"{n} nodes, {mode}: {len(reqs)} requests")
        results, errors, window = _drive(swarm, reqs)
        cpu1 = [cpu_seconds(p) for p in pids]
        net = meter.stop()
        statuses = swarm.statuses(swarm.procs)
    finally:
        if meter is not None:
            meter.close()  # a window that failed leaves no poller behind
        swarm.close()
    ttft = [r["ttft_s"] * 1000.0 for r in results]
    decide = [r["decision_s"] * 1000.0 for r in results if r.get("decision_s") is not None]
    prompt = sum(r["prompt_tokens"] for r in results)
    reused = sum(r["reused_tokens"] for r in results)
    out: dict[str, Any] = {
        "nodes": n,
        "discovery": mode,
        "requests": len(reqs),
        "completed": len(results),
        "errors": errors[:5],
        "idle_cpu_per_node": idle["idle_cpu_per_node"],
        "idle_cpu_per_node_stats": idle["idle_cpu_per_node_stats"],
        "idle_bytes_in_per_node_per_s": idle.get("bytes_in_per_node_per_s"),
        "rss_mib_per_node": idle["rss_mib_per_node"],
        "cpu_s_per_request": round((sum(cpu1) - sum(cpu0)) / max(1, len(results)), 4),
        "hit_rate": round(reused / prompt, 4) if prompt else 0.0,
        "ttft_ms_mean": round(statistics.fmean(ttft), 1) if ttft else None,
        "ttft_ms_p99": round(percentile(ttft, 99), 1) if ttft else None,
        "decision_ms_mean": round(statistics.fmean(decide), 2) if decide else None,
        "decision_ms_p99": round(percentile(decide, 99), 2) if decide else None,
        **ttft_by_path(results),
        "checked_answers": sum(bool(a.get("check")) for r in results for a in r.get("attempts", [])),
        "held_answers": sum(bool(a.get("held_tokens")) for r in results for a in r.get("attempts", [])),
        "served_remote_share": round(sum(not r["served_locally"] for r in results) / max(1, len(results)), 3),
        "predicted_equals_realised_share": round(
            sum(r["reused_tokens"] == r["predicted_reused_tokens"] for r in results) / max(1, len(results)), 3),
        "workload_window_s": round(window, 1),
        "load_average_1m": idle.get("load_average_1m"),
        "live_wall_s": round(time.monotonic() - started, 1),  # start to close, the simulation not included
        **settled,
    }
    if net is not None:
        bytes_in = [net[p][0] / window for p in pids]
        out["bytes_in_per_node_per_s"] = round(statistics.fmean(bytes_in), 1)
        out["bytes_in_per_node_per_s_p99"] = round(percentile(bytes_in, 99), 1) if bytes_in else 0.0
        out["bytes_in_busiest_node_per_s"] = round(max(bytes_in), 1)
        out["bytes_note"] = "TCP payload (tcp_info via ss) during the workload window, forwarded requests and answers included"
        out.update(meter.summary())
    if mode == "directory":
        dirs = [s["discovery"]["directory"] for s in statuses if s is not None and "directory" in s.get("discovery", {})]
        out["directory_lookups"] = sum(d["lookups"] for d in dirs)
        out["directory_blind"] = sum(d["blind"] for d in dirs)
        out["dht_lookups"] = sum(d["dht_lookups"] for d in dirs)
        discs = [s["discovery"] for s in statuses if s is not None and "load_topic_count" in s.get("discovery", {})]
        out["load_topic_counts"] = sorted({d["load_topic_count"] for d in discs})
        out["load_topic_moves"] = sum(d["load_topic_moves"] for d in discs)
        out["load_reports_heard_per_node"] = round(statistics.fmean(d["load_reports_heard"] for d in discs), 1) if discs else None
    say(f"{n} nodes, {mode}: simulating the same requests")
    out.update(predict(n, mode, reqs, encoder, seed, verify=verify, check_cache=check_cache))
    if out["ttft_ms_mean"] and out["sim_ttft_ms_mean"]:
        out["live_over_sim_ttft"] = round(out["ttft_ms_mean"] / out["sim_ttft_ms_mean"], 3)
    return out


def run_directory_bench(
    node_counts: list[int],
    *,
    requests: int = 40,
    rate: float = 1.0,
    idle_s: float = 15.0,
    settle_s: float = 5.0,
    seed: int = 0,
    popularity: str = "zipf:1",
    log_dir: Path | None = None,
    progress: Any = None,
    partial: Any = None,
    check_cache: bool = False,
    verify: bool = True,
    sim_only: bool = False,
) -> dict[str, Any]:
    """Every node count, both modes on the same requests; ``partial(result)`` after each run.
    ``sim_only``: the simulator's predictions alone (no node processes)."""
    say = progress or (lambda _msg: None)
    result: dict[str, Any] = {
        "benchmark": "directory",
        "setting": {"node_counts": node_counts, "requests": requests, "rate_per_s": rate, "idle_s": idle_s,
                    "settle_s": settle_s, "seed": seed, "popularity": popularity, "engine": "simulated (calibrated cost model, speed 1.0)",
                    "cost_model": EngineCostModel().as_dict(), "engine_options": bench_engine_options(check_cache),
                    "verify": "the node default" if verify else "off (no probation, no spot checks)",
                    "live": not sim_only,
                    "workload": "MMLU five-shot, subjects by popularity, 4 output tokens, approx tokenizer, Poisson arrivals, random entry"},
        "runs": [],
    }
    for n in node_counts:
        reqs, encoder = build_workload(n, requests, rate, seed, popularity)
        for mode in MODES:
            if sim_only:
                run = {"nodes": n, "discovery": mode, "requests": len(reqs),
                       **predict(n, mode, reqs, encoder, seed, verify=verify, check_cache=check_cache)}
                result["runs"].append(run)
                continue
            try:
                run = run_once(n, mode, reqs, encoder, idle_s=idle_s, settle_s=settle_s, seed=seed, log_dir=log_dir, say=say,
                               check_cache=check_cache, verify=verify)
            except Exception as exc:  # a size that does not fit is a result too
                run = {"nodes": n, "discovery": mode, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            result["runs"].append(run)
            if partial is not None:
                partial(with_provenance(dict(result)))
    return with_provenance(result)
