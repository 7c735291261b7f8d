"""Why cost misses (issue 22): per served request, compare what the decision saw with the ground truth.

PYTHONPATH=. python docs/results/issue22-evict/diag.py SHARED_CORES ONE_WAY_MS IN_FLIGHT VARIANTS_JSON SEEDS REQUESTS
(4 nodes, cost-vs-paper's workload; prints one JSON object)
"""
import collections, json, statistics as st, sys
from p2pinfer.lab.cost_vs_paper import LIVE_ENGINE
from p2pinfer.lab.live_bench import mmlu_live_requests
from p2pinfer.lab.live_experiment import default_cache_budget
from p2pinfer.sim.simulator import SimConfig, Simulator
from p2pinfer.workloads import PromptEncoder, load_tokenizer
from p2pinfer.workloads.base import Prompt, TimedRequest

enc = PromptEncoder(load_tokenizer("auto"))
nodes, shared, one_way, conc = 4, float(sys.argv[1]), sys.argv[2], int(sys.argv[3])
variants = json.loads(sys.argv[4]); seeds = int(sys.argv[5]); nreq = int(sys.argv[6])
out = {"nodes": nodes, "shared_cores": shared or None, "one_way_ms": float(one_way), "concurrency": conc,
       "seeds": seeds, "requests_per_run": nreq, "cold_means": "reused fewer than 100 tokens (a header is 214..427)",
       "variants": {}}
for name, v in variants.items():
    agg = collections.Counter(); tt = []
    for seed in range(1, seeds + 1):
        reqs = mmlu_live_requests(nreq, nodes, max_subjects=8, seed=seed)[0]
        timed = [TimedRequest(0.0, Prompt(r.label, (r.prompt,), output_tokens=r.max_tokens), entry=r.entry) for r in reqs]
        cfg = SimConfig(nodes=nodes, latency=one_way, cache_tokens=default_cache_budget(8, nodes), cost=LIVE_ENGINE,
                        warmup=0.0, seed=seed, shared_cores=shared, concurrency=conc, **v)
        sim = Simulator(cfg, timed, enc)
        truth = {}
        orig = sim._begin

        def _begin(req, entry, decision, hashes, sim=sim, orig=orig, truth=truth):
            node = entry if decision.target == "local" else sim.by_id[decision.target]
            anywhere = max(n.cache.match(req.tokens, touch=False) for n in sim.alive)
            truth[req.rid] = (node.cache.match(req.tokens, touch=False), anywhere)
            orig(req, entry, decision, hashes)

        sim._begin = _begin
        tt.append(sim.run()["ttft_ms"]["mean"])
        for q in sim.completed:
            held, anywhere = truth[q.rid]
            agg["requests"] += 1
            if q.reused < 100:
                agg["cold"] += 1
                agg["cold_and_held_nowhere_at_decision" if anywhere < 100 else "cold_though_held_somewhere"] += 1
            if q.predicted > q.reused + 16:
                agg["reused_less_than_predicted"] += 1
                agg["..target_had_it_at_decision_evicted_before_start" if held + 16 >= q.predicted
                    else "..target_no_longer_had_it_at_decision_stale_view"] += 1
    out["variants"][name] = {"config": v, "ttft_ms_mean": round(st.mean(tt), 1), **agg}
print(json.dumps(out, indent=1))
