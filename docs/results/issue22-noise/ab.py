"""Issue 22, contention noise: the speed noise band (``TtftEstimator.speed_noise_z``) on and off, paired.

Cells: cost-vs-paper's (`bench swarm`'s workload and cache pressure, LIVE_ENGINE, closed loop), seeds
paired between the variants. ``--noise S`` multiplies every prefill speed a node *measures* by a
lognormal factor (sigma S, median 1; seeded per run) without changing the work: the estimate noise
of a live box where other processes share the cores (live per-prefill ms/token spread: coefficient
of variation 0.55-1.0 in the a096235 runs, against about 0.2 from the simulator's core sharing alone).
Needs the band, so it runs at commit 9c2e33f only (reverted after). Run from the worktree root:

    PYTHONPATH=. python docs/results/issue22-noise/ab.py --z 0,2 --seeds 10 --out FILE [--noise 0.5] [--nodes 4]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
from pathlib import Path
import random
import statistics
import sys

from dataclasses import replace
import subprocess

from p2pinfer.core import engine_queue
from p2pinfer.core import policies as pol
from p2pinfer.core.policies import CostPolicy, TtftEstimator
from p2pinfer.lab.cost_vs_paper import LIVE_ENGINE, SUBJECTS
from p2pinfer.lab.live_bench import mmlu_live_requests
from p2pinfer.lab.live_experiment import default_cache_budget
from p2pinfer.lab.live_sim import simulate_live_run
from p2pinfer.sim import simulator as simmod

STATE = {"z": 2.0, "noise": 0.0, "rng": random.Random(0), "cv": [], "cold_only": False}
_candidates = pol._candidates


def candidates(estimator, request, local, peers, now):
    """``--cold-only``: the band only where no candidate holds any of the prompt (a cold placement)."""
    if STATE["cold_only"] and (any(m for _, m in peers) or (local is not None and local.match_tokens)):
        estimator = replace(estimator, speed_noise_z=0.0)
    return _candidates(estimator, request, local, peers, now)


pol._candidates = candidates


def _cost_rule(self):
    cfg = self.config
    return CostPolicy(estimator=TtftEstimator(work_weight=cfg.work_weight, drain_reported_queue=cfg.drain_reported_queue,
                                              speed_noise_z=STATE["z"]))


simmod.Simulator._cost_rule = _cost_rule
_prefilled = engine_queue.EngineQueue.prefilled


def prefilled(self, ticket, uncached=0, ms_per_token=None, now=None):
    if ms_per_token is not None and uncached >= engine_queue.MIN_TIMED_PREFILL:
        if STATE["noise"]:
            ms_per_token *= math.exp(STATE["rng"].gauss(0.0, STATE["noise"]))
        STATE["cv"].append(ms_per_token)
    return _prefilled(self, ticket, uncached, ms_per_token, now)


engine_queue.EngineQueue.prefilled = prefilled


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--z", default="0,2")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--nodes", default="4")
    ap.add_argument("--one-way", default="1,50,200")
    ap.add_argument("--concurrency", default="4,16")
    ap.add_argument("--policies", default="cost")
    ap.add_argument("--noise", type=float, default=0.0)
    ap.add_argument("--cold-only", action="store_true", help="the band only for cold placements (no candidate holds a prefix)")
    ap.add_argument("--out")
    a = ap.parse_args()
    zs = [float(x) for x in a.z.split(",")]
    STATE["cold_only"] = a.cold_only
    rows = []
    workloads = {}
    for nodes, one_way, conc in itertools.product([int(x) for x in a.nodes.split(",")],
                                                  [float(x) for x in a.one_way.split(",")],
                                                  [int(x) for x in a.concurrency.split(",")]):
        budget = default_cache_budget(SUBJECTS, nodes)
        for seed in range(1, a.seeds + 1):
            if (nodes, seed) not in workloads:
                workloads[(nodes, seed)] = mmlu_live_requests(a.requests, nodes, max_subjects=SUBJECTS, seed=seed)[0]
            for policy in a.policies.split(","):
                for z in zs if policy in ("cost", "oracle") else [None]:
                    STATE.update(z=z if z is not None else 2.0, noise=a.noise, rng=random.Random(f"{seed}-noise"), cv=[])
                    r = simulate_live_run(workloads[(nodes, seed)], policy=policy, nodes=nodes, cache_tokens=budget,
                                          one_way_ms=one_way, cost=LIVE_ENGINE, concurrency=conc, seed=seed,
                                          shared_cores=2.0)
                    cv = STATE["cv"]
                    row = {"nodes": nodes, "one_way_ms": one_way, "concurrency": conc, "seed": seed, "policy": policy,
                           "z": z, "noise": a.noise, "ttft_ms_mean": r["ttft_ms"]["mean"], "hit_rate": r["hit_rate"],
                           "served_max_over_mean": r["load"]["served_max_over_mean"],
                           "measured_speed_cv": round(statistics.stdev(cv) / statistics.fmean(cv), 3) if len(cv) > 1 else None}
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)
    summary = []
    keys = sorted({(r["nodes"], r["one_way_ms"], r["concurrency"]) for r in rows})
    for k in keys:
        cell = [r for r in rows if (r["nodes"], r["one_way_ms"], r["concurrency"]) == k]
        def series(policy, z):
            return [r["ttft_ms_mean"] for r in sorted(cell, key=lambda r: r["seed"]) if r["policy"] == policy and r["z"] == z]
        s = {"nodes": k[0], "one_way_ms": k[1], "concurrency": k[2]}
        for policy in a.policies.split(","):
            for z in zs if policy in ("cost", "oracle") else [None]:
                v = series(policy, z)
                s[f"{policy}_z{z:g}" if z is not None else policy] = round(statistics.fmean(v), 1)
                s[f"{policy}_z{z:g}_served_max_over_mean" if z is not None else f"{policy}_served_max_over_mean"] = round(
                    statistics.fmean(r["served_max_over_mean"] for r in cell if r["policy"] == policy and r["z"] == z), 3)
        if "cost" in a.policies and len(zs) == 2:
            old, new = series("cost", zs[0]), series("cost", zs[1])
            d = [n - o for n, o in zip(new, old)]
            s["cost_new_over_old"] = round(statistics.fmean(new) / statistics.fmean(old), 3)
            s["paired_diff_ms"] = round(statistics.fmean(d), 1)
            s["paired_diff_se_ms"] = round(statistics.stdev(d) / math.sqrt(len(d)), 1) if len(d) > 1 else None
        summary.append(s)
        print(json.dumps(s))
    if a.out:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "p2pinfer"], capture_output=True, text=True).stdout.strip())
        Path(a.out).write_text(json.dumps({"command": "PYTHONPATH=. python " + " ".join(sys.argv), "commit": commit,
                                           "p2pinfer_modified_since_commit": dirty, "summary": summary,
                                           "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
