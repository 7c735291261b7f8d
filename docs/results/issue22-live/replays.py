"""Mean of diag.py's replays per run and policy (and cost/paper): python replays.py DIAG.json"""

import json
import statistics
import sys
from collections import defaultdict

rows = json.load(open(sys.argv[1]))["rows"]
acc: dict[tuple[str, str], list[float]] = defaultdict(list)
for r in rows:
    acc[(r["run"], r["policy"])].append(r["ttft_mean"])
for run in sorted({k[0] for k in acc}):
    c, p = statistics.mean(acc[(run, "cost")]), statistics.mean(acc[(run, "paper")])
    print(f"{run}: cost {c:,.0f} paper {p:,.0f} cost/paper {c / p:.3f} (seeds {len(acc[(run, 'cost')])})")
