"""Issue 22's live runs side by side: per run and policy, mean TTFT, ratio to the run's
round-robin, cost/paper, served per node and max/mean; medians over runs of each delay.

    python docs/results/issue22-live/summarise.py docs/results/issue22-live/swarm-*.json
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict


def main(paths: list[str]) -> None:
    by_delay: dict[float, list[dict]] = defaultdict(list)
    for path in paths:
        doc = json.load(open(path))
        delay = doc["network"]["requested_one_way_delay_ms"]
        pol = {p["policy"]: p for p in doc["policies"]}
        rr = pol["round-robin"]["ttft_ms"]["mean"]
        row = {"file": path.rsplit("/", 1)[-1], "commit": doc["provenance"]["commit"][:7], "at": doc["provenance"]["measured_at"]}
        for name, p in pol.items():
            served = p["served_per_node"]
            row[name] = {
                "mean": p["ttft_ms"]["mean"], "p50": p["ttft_ms"]["p50"], "p99": p["ttft_ms"]["p99"],
                "ratio_rr": round(p["ttft_ms"]["mean"] / rr, 3), "hit": p["hit_rate"], "served": served,
                "max_mean": round(max(served) / statistics.mean(served), 2), "completed": p["completed"],
                "sim_mean": p["simulator"]["ttft_ms"]["mean"] if isinstance(p.get("simulator"), dict) else None,
                "speeds": p.get("prefill_ms_per_token_nodes"),
            }
        row["cost_over_paper"] = round(pol["cost"]["ttft_ms"]["mean"] / pol["paper"]["ttft_ms"]["mean"], 3)
        by_delay[delay].append(row)
    out = {}
    for delay, rows in sorted(by_delay.items()):
        for r in rows:
            print(f"{delay:g} ms {r['file']} {r['commit']}: cost/paper {r['cost_over_paper']}")
            for name in ("cost", "paper", "round-robin"):
                p = r[name]
                print(f"   {name:12s} mean {p['mean']:8.0f} p50 {p['p50']:8.0f} p99 {p['p99']:8.0f} /rr {p['ratio_rr']:.3f} "
                      f"hit {p['hit']:.3f} served {p['served']} max/mean {p['max_mean']} sim {p['sim_mean']} speeds {p['speeds']}")
        med = {name: statistics.median(r[name]["ratio_rr"] for r in rows) for name in ("cost", "paper")}
        cp = [r["cost_over_paper"] for r in rows]
        print(f"{delay:g} ms: median /rr cost {med['cost']:.3f} paper {med['paper']:.3f}; cost/paper per run {cp}")
        out[str(delay)] = {"runs": rows, "median_ratio_rr": med, "cost_over_paper": cp}
    json.dump(out, open("/dev/stderr", "w"), indent=1) if "--json" in sys.argv else None


if __name__ == "__main__":
    main([a for a in sys.argv[1:] if not a.startswith("--")])
