import json, sys, statistics as st, math, collections
rows = []
for f in sys.argv[3:]:
    rows += json.load(open(f))
a, b = sys.argv[1], sys.argv[2]
by = collections.defaultdict(dict)
for r in rows:
    by[(r["nodes"], r["shared"], r["one_way"], r["conc"])].setdefault(r["variant"], {})[r["seed"]] = r["ttft"]
for cell, d in sorted(by.items()):
    if a not in d or b not in d: continue
    seeds = sorted(set(d[a]) & set(d[b]))
    diffs = [d[a][s] - d[b][s] for s in seeds]
    se = st.stdev(diffs) / math.sqrt(len(diffs))
    print(cell, f"{a} {st.mean(d[a][s] for s in seeds):.0f} {b} {st.mean(d[b][s] for s in seeds):.0f} ratio {st.mean(d[a][s] for s in seeds)/st.mean(d[b][s] for s in seeds):.3f} diff {st.mean(diffs):+.0f} ± {se:.0f} worse {sum(x>0 for x in diffs)}/{len(diffs)}")
