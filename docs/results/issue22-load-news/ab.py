import sys, json, statistics
from p2pinfer.lab.live_bench import mmlu_live_requests
from p2pinfer.lab.live_experiment import default_cache_budget
from p2pinfer.lab.live_sim import simulate_live_run
from p2pinfer.lab.cost_vs_paper import LIVE_ENGINE
cells = [(4, 0.0, 1.0, 16), (4, 2.0, 1.0, 4), (4, 2.0, 1.0, 16), (4, 0.0, 50.0, 16), (4, 0.0, 1.0, 4)]
out = {}
for nodes, shared, lat, conc in cells:
    vals = []
    for seed in range(1, 9):
        reqs, _ = mmlu_live_requests(200, nodes, max_subjects=8, seed=seed)
        r = simulate_live_run(reqs, policy="cost", nodes=nodes, cache_tokens=default_cache_budget(8, nodes), one_way_ms=lat, cost=LIVE_ENGINE, concurrency=conc, seed=seed, shared_cores=shared)
        vals.append(r["ttft_ms"]["mean"])
    out[str((nodes, shared, lat, conc))] = vals
    print(nodes, shared, lat, conc, round(statistics.mean(vals)), [round(v) for v in vals], flush=True)
json.dump(out, open(sys.argv[1], "w"))
