"""Issue 22, contention noise: why `cost` loses to `paper` in the replays of the a096235 live runs.

Replays each saved run (as `bench swarm-replay --cores 2`: the shared-cores model) for `cost` and
`paper`, over several simulator seeds, and records every decision: the candidates' speed estimates,
whether any candidate held a prefix, where cold prompts went. Run from the worktree root:

    PYTHONPATH=. python docs/results/issue22-noise/diag.py [RUN.json ...] [--seeds N] [--engine-from paper] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
import statistics
import subprocess
import sys

from p2pinfer.core import policies as pol
from p2pinfer.lab import live_sim
from p2pinfer.lab.live_bench import mmlu_live_requests
from p2pinfer.sim import simulator as simmod

RUNS = [Path(f"docs/results/swarm-1ms-a096235-run{i}.json") for i in (1, 2, 3)]
LOG: list[dict] = []
NODES: list = []


def _wrap(cls):
    orig = cls.decide

    def decide(self, request, local, view, now, rng):
        d = orig(self, request, local, view, now, rng)
        cands = []
        for c in d.candidates:
            unc = max(1, request.prompt_tokens - c.predicted_match_tokens)
            cands.append((c.target, c.predicted_match_tokens, round(c.prefill_ms / unc, 3), round(c.queue_ms, 1)))
        LOG.append({"node": local.node_id, "chosen": d.target, "prompt": request.prompt_tokens, "cands": cands,
                    "local_speed": local.load.prefill_ms_per_token})
        return d

    cls.decide = decide


_wrap(pol.CostPolicy)
_wrap(pol.PaperPolicy)
_orig_result = simmod.Simulator._result


def _result(self, wall_s):
    NODES[:] = self.nodes
    return _orig_result(self, wall_s)


simmod.Simulator._result = _result
BAND = hasattr(pol.TtftEstimator(), "speed_noise_z")
"""The noise band exists only at commit 9c2e33f (measured, not adopted); elsewhere ``--z`` is ignored."""
Z = {"z": pol.TtftEstimator().speed_noise_z if BAND else 0.0}


def _cost_rule(self):
    cfg = self.config
    band = {"speed_noise_z": Z["z"]} if BAND else {}
    return pol.CostPolicy(estimator=pol.TtftEstimator(work_weight=cfg.work_weight, drain_reported_queue=cfg.drain_reported_queue,
                                                      **band))


simmod.Simulator._cost_rule = _cost_rule


def replay(path: Path, policy: str, seed: int, engine_from: str | None = None) -> dict:
    """``engine_from``: fit the engine on that policy's live outcomes (default: this policy's own, as
    `bench swarm-replay` does), so that two rules can be compared on one engine."""
    data = json.loads(path.read_text())
    reqs, _ = mmlu_live_requests(data["requests"], data["nodes"], max_subjects=len(data["workload"]["subjects"]),
                                 seed=data["seed"], max_tokens=data["max_tokens"])
    p = next(x for x in data["policies"] if x["policy"] == policy)
    fit = next(x for x in data["policies"] if x["policy"] == (engine_from or policy))
    done = [o for o in fit["outcomes"] if o.get("ok") and o.get("engine_prefill_ms") is not None]
    ends = [o["sent_s"] + o["ttft_ms"] / 1000 for o in done]
    work = live_sim.full_speed_work([(e - o["engine_prefill_ms"] / 1000, e) for e, o in zip(ends, done)], 2.0)
    cost = live_sim.fit_engine_timing([(o["prompt_tokens"], o["reused"], w * 1000) for o, w in zip(done, work)])
    LOG.clear()
    sim = live_sim.simulate_live_run(reqs, policy=policy, nodes=data["nodes"], cache_tokens=data["cache_tokens_per_node"],
                                     one_way_ms=(p.get("peer_rtt_ms_median") or 0) / 2, cost=cost,
                                     concurrency=data["concurrency"], seed=seed, shared_cores=2.0)
    ids = {n.id: n.idx for n in NODES}
    cold = [d for d in LOG if max(c[1] for c in d["cands"]) < 64]
    cold_fastest = 0
    for d in cold:
        speeds = {c[0]: c[2] for c in d["cands"]}
        cold_fastest += speeds[d["chosen"]] == min(speeds.values())
    skips = [d for d in LOG if d["cands"] and max(c[1] for c in d["cands"]) >= 64
             and next(c[1] for c in d["cands"] if c[0] == d["chosen"]) < max(c[1] for c in d["cands"]) - 64]
    skip_slower_holder = 0
    skip_holder_queue = []
    for d in skips:
        best = max(d["cands"], key=lambda c: (c[1], -c[3]))
        ch = next(c for c in d["cands"] if c[0] == d["chosen"])
        skip_slower_holder += best[2] > ch[2]
        skip_holder_queue.append(best[3] - ch[3])
    spread = [max(c[2] for c in d["cands"]) / min(c[2] for c in d["cands"]) for d in LOG]
    cold_to = [0] * len(NODES)
    for d in cold:
        tgt = d["node"] if d["chosen"] == "local" else d["chosen"]
        cold_to[ids[tgt]] += 1
    return {
        "run": path.name, "policy": policy, "seed": seed, "engine_from": engine_from or policy, "z": Z["z"],
        "ttft_mean": sim["ttft_ms"]["mean"], "hit_rate": sim["hit_rate"],
        "served": [n.served for n in NODES],
        "final_speed": [round(n.engine.ms_per_token, 2) for n in NODES],
        "cold_decisions": len(cold), "cold_to_node": cold_to, "cold_to_fastest_estimate": cold_fastest,
        "skips": len(skips), "skip_holder_slower_estimate": skip_slower_holder,
        "skip_holder_extra_queue_ms_median": round(statistics.median(skip_holder_queue), 1) if skip_holder_queue else None,
        "speed_spread_max_over_min_median": round(statistics.median(spread), 3),
        "skips": len(skips), "skip_holder_slower_estimate": skip_slower_holder,
        "skip_holder_extra_queue_ms_median": round(statistics.median(skip_holder_queue), 1) if skip_holder_queue else None,
        "speed_spread_max_over_min_p90": round(statistics.quantiles(spread, n=10)[-1], 3),
        "engine_ms_per_token": cost.prefill_ms_per_token,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="*", type=Path, help="bench swarm JSONs (default: the three a096235 runs)")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--out")
    ap.add_argument("--policies", default="cost,paper")
    ap.add_argument("--z", type=float, default=Z["z"], help="TtftEstimator.speed_noise_z of cost (0: the rule before)")
    ap.add_argument("--engine-from", default="own", help="own (each policy its own fit, as swarm-replay) or a policy name")
    a = ap.parse_args()
    Z["z"] = a.z
    rows = []
    for path in a.runs or RUNS:
        for policy in a.policies.split(","):
            for seed in range(1, a.seeds + 1):
                r = replay(path, policy, seed, None if a.engine_from == "own" else a.engine_from)
                rows.append(r)
                print(json.dumps(r), file=sys.stderr)
    if a.out:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "p2pinfer"], capture_output=True, text=True).stdout.strip())
        Path(a.out).write_text(json.dumps({"command": "PYTHONPATH=. python " + " ".join(sys.argv), "commit": commit,
                                           "p2pinfer_modified_since_commit": dirty, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
