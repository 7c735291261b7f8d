"""Issue 22 (eviction): pair the full cost-vs-paper grids before/after and the quick-grid A/B runs.

python docs/results/issue22-evict/summarise.py  (reads the JSON files next to it, writes summary.json)
"""
import json, math, statistics as st, collections, sys
from pathlib import Path

here = Path(__file__).parent


def paired(a, b):
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    return st.mean(diffs), st.stdev(diffs) / math.sqrt(len(diffs))


out = {"full_grid_cost_after_vs_before": [], "quick_grid_ab": []}
runs = {}
for name in ("before", "after"):
    for r in json.loads((here / f"cost-vs-paper-{name}.json").read_text())["runs"]:
        if r["policy"] == "cost":
            key = (r["nodes"], r["shared_cores"], r["one_way_ms"], r["concurrency"])
            runs.setdefault((name, key), {})[r["seed"]] = r["ttft_ms_mean"]
for (name, key), seeds in sorted(runs.items(), key=lambda kv: (kv[0][1][0], kv[0][1][1] is None, kv[0][1][2:])):
    if name != "after":
        continue
    before = runs[("before", key)]
    s = sorted(seeds)
    d, se = paired([seeds[i] for i in s], [before[i] for i in s])
    out["full_grid_cost_after_vs_before"].append({
        "nodes": key[0], "shared_cores": key[1], "one_way_ms": key[2], "concurrency": key[3],
        "cost_before_ms": round(st.mean(before.values()), 1), "cost_after_ms": round(st.mean(seeds.values()), 1),
        "ratio": round(st.mean(seeds.values()) / st.mean(before.values()), 3),
        "paired_diff_ms": round(d, 1), "paired_diff_se_ms": round(se, 1),
        "seeds_worse": sum(seeds[i] > before[i] for i in s),
    })
ab = json.loads((here / "ab-quick-runs.json").read_text())["runs"]
by = collections.defaultdict(dict)
for r in ab:
    by[(r["nodes"], r["shared"], r["one_way"], r["conc"])].setdefault(r["variant"], {})[r["seed"]] = r["ttft"]
pairs = [(v, "base-cost") for v in ("nt-cost", "ta0-cost")] + [("ta0-oracle", "base-oracle"), ("ta0-paper", "base-paper")]
pairs += [(v, "ta0-cost") for v in ("st1-cost", "am1-cost", "am2-cost", "amc1-cost", "stc1-cost")]
pairs += [("amc1-oracle", "ta0-oracle"), ("ta0-cost", "ta0-oracle"), ("ta0-cost", "ta0-paper")]
for a, b in pairs:
    for cell, d in sorted(by.items()):
        s = sorted(set(d[a]) & set(d[b]))
        diff, se = paired([d[a][i] for i in s], [d[b][i] for i in s])
        ma, mb = st.mean(d[a][i] for i in s), st.mean(d[b][i] for i in s)
        out["quick_grid_ab"].append({
            "a": a, "b": b, "nodes": cell[0], "shared_cores": cell[1] or None, "one_way_ms": cell[2], "concurrency": cell[3],
            "a_ms": round(ma, 1), "b_ms": round(mb, 1), "ratio": round(ma / mb, 3),
            "paired_diff_ms": round(diff, 1), "paired_diff_se_ms": round(se, 1), "seeds": len(s),
            "seeds_a_worse": sum(d[a][i] > d[b][i] for i in s),
        })
json.dump(out, open(here / "summary.json", "w"), indent=1)
print("wrote", here / "summary.json")
