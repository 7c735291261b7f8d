import json, glob, statistics as st, sys
rows = {}
for side in ("before", "after"):
    for f in sorted(glob.glob(f"/work/notes/b21/conv-{side}-run*.json")):
        try: d = json.load(open(f))
        except Exception: continue
        turns = d["turns_with_reply_cache"]
        fw = [t["ttft_ms"] for t in turns if t["entry"] != t["served_by"]]
        loc = [t["ttft_ms"] for t in turns if t["entry"] == t["served_by"]]
        later = [t["ttft_ms"] for t in turns if t["turn"] >= 2]
        rows.setdefault(side, []).append(dict(file=f.split('/')[-1], forwarded=len(fw), fw_ttft_median=st.median(fw) if fw else None,
            fw_max=max(fw) if fw else None, local_ttft_median=st.median(loc) if loc else None, turns2_mean=st.mean(later),
            reuse=d["with_reply_cache"]["reuse_of_previous_turn_min"], commit=d["provenance"]["commit"][:7]))
for side, rs in rows.items():
    for r in rs: print(side, r)
