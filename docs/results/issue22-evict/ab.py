"""A/B of cost-rule variants on the cost-vs-paper cells (lab script, issue 22)."""
import itertools, json, sys, time
from dataclasses import replace
from p2pinfer.lab.cost_vs_paper import LIVE_ENGINE, QUICK_GRID, GRID
from p2pinfer.lab.live_bench import mmlu_live_requests
from p2pinfer.lab.live_experiment import default_cache_budget
from p2pinfer.sim.simulator import SimConfig, Simulator
from p2pinfer.workloads import PromptEncoder, load_tokenizer
from p2pinfer.workloads.base import Prompt, TimedRequest

def main():
    out = sys.argv[1]
    variants = json.loads(sys.argv[2])  # {"name": {"policy": ..., simconfig overrides}}
    quick = sys.argv[3] == "quick"
    seeds = int(sys.argv[4]) if len(sys.argv) > 4 else (3 if quick else 5)
    nreq = int(sys.argv[5]) if len(sys.argv) > 5 else (120 if quick else 200)
    grid = QUICK_GRID if quick else GRID
    enc = PromptEncoder(load_tokenizer("auto"))
    rows = []
    t0 = time.time()
    for nodes, shared, one_way, conc in itertools.product(*grid.values()):
        budget = default_cache_budget(8, nodes)
        for seed in range(1, seeds + 1):
            reqs = mmlu_live_requests(nreq, nodes, max_subjects=8, seed=seed)[0]
            timed = [TimedRequest(0.0, Prompt(r.label, (r.prompt,), output_tokens=r.max_tokens), entry=r.entry) for r in reqs]
            for name, v in variants.items():
                v = dict(v)
                cfg = SimConfig(nodes=nodes, latency=f"{one_way:g}", cache_tokens=budget, cost=LIVE_ENGINE, warmup=0.0,
                                seed=seed, shared_cores=shared, concurrency=conc, **v)
                r = Simulator(cfg, timed, enc).run()
                rows.append(dict(variant=name, nodes=nodes, shared=shared, one_way=one_way, conc=conc, seed=seed,
                                 ttft=r["ttft_ms"]["mean"], hit=r["hit_rate"], fwd=r["forwarded_share"],
                                 served=r["load"]["served_max_over_mean"]))
        print(f"{time.time()-t0:.0f}s cell {nodes} {shared} {one_way} {conc}", file=sys.stderr, flush=True)
    json.dump(rows, open(out, "w"), indent=0)

main()
