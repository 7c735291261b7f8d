"""Issue 18 part 4: the simulator with 1 slot per node against 4, in bench swarm's setting.

4 nodes on 2 shared cores, 16 requests in flight (closed loop), the cost policy, MMLU five-shot prompts
of bench swarm's 8 subjects (random entry nodes) with answers of 32 and 128 tokens, the default engine
cost model, the cache budget bench swarm gives. Simulated time, so the figures do not depend on this
machine's load. Prints one JSON object (command and commit included).

    nice -n 19 python docs/results/issue18-sim-slots/sim_slots.py > docs/results/issue18-sim-slots/sim-slots.json
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

from p2pinfer.core.costmodel import EngineCostModel
from p2pinfer.lab.live_bench import mmlu_live_requests
from p2pinfer.lab.live_experiment import default_cache_budget
from p2pinfer.lab.live_sim import simulate_live_run

NODES, CORES, CONCURRENCY, REQUESTS, SUBJECTS = 4, 2.0, 16, 200, 8
SEEDS = (1, 2, 3, 4, 5)


def main() -> None:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "p2pinfer"], capture_output=True, text=True).stdout.strip())
    budget = default_cache_budget(SUBJECTS, NODES)
    cells = []
    for max_tokens in (32, 128):
        for slots in (1, 4):
            runs = []
            for seed in SEEDS:
                reqs, _ = mmlu_live_requests(REQUESTS, NODES, max_subjects=SUBJECTS, seed=seed, max_tokens=max_tokens)
                r = simulate_live_run(reqs, policy="cost", nodes=NODES, cache_tokens=budget, one_way_ms=1.0,
                                      cost=EngineCostModel(), concurrency=CONCURRENCY, seed=seed, shared_cores=CORES,
                                      slots=slots)
                runs.append({"seed": seed, "ttft_ms": r["ttft_ms"], "hit_rate": r["hit_rate"],
                             "forwarded_share": r["forwarded_share"]})
            means = [x["ttft_ms"]["mean"] for x in runs]
            p50s = [x["ttft_ms"]["p50"] for x in runs]
            cells.append({
                "max_tokens": max_tokens, "slots_per_node": slots,
                "ttft_mean_ms": {"median": statistics.median(means), "min": min(means), "max": max(means)},
                "ttft_p50_ms": {"median": statistics.median(p50s), "min": min(p50s), "max": max(p50s)},
                "hit_rate_median": statistics.median(x["hit_rate"] for x in runs),
                "runs": runs,
            })
    print(json.dumps({
        "command": "nice -n 19 python " + " ".join(sys.argv),
        "commit": commit, "tree_dirty": dirty,
        "setting": {"nodes": NODES, "shared_cores": CORES, "concurrency": CONCURRENCY, "requests": REQUESTS,
                    "subjects": SUBJECTS, "policy": "cost", "one_way_ms": 1.0, "cache_tokens_per_node": budget,
                    "seeds": list(SEEDS), "cost_model": EngineCostModel().as_dict(),
                    "time": "simulated (virtual clock): independent of this machine's load"},
        "cells": cells,
    }, indent=1))


if __name__ == "__main__":
    main()
