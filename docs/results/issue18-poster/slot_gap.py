"""The slot loop's time between two decode steps, single stream, per source tree (issue 18).

``python slot_gap.py TREE_A TREE_B [ROUNDS]``: for each round, a fresh process per tree
(alternating which goes first) runs 4 greedy generations of 64 tokens from a 300-token
prompt on the llama.cpp engine (2 threads, cache emptied each time) and measures, inside
the slot loop, the wall time of each ``llama_decode`` step and the gap from the end of one
step to the start of the next (sampling, the loop's own Python, handing events out).
Prints one JSON object: per tree, the per-round medians in ms.
"""

import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, statistics, time, trio
from p2pinfer.engines import GenerationParams
from p2pinfer.engines.llama_cpp import LlamaCppEngine
from p2pinfer.engines.model_files import default_model_path
eng = LlamaCppEngine(str(default_model_path()), context_size=4096, threads=2)
rt = eng._loop._rt
steps, gaps, last = [], [], [None]
orig = rt.decode
def timed(batch):
    t0 = time.perf_counter()
    if last[0] is not None:
        gaps.append(t0 - last[0])
    orig(batch)
    last[0] = time.perf_counter()
    steps.append(last[0] - t0)
rt.decode = timed
toks = rt.tokenize("The history of the printing press begins in the fifteenth century. " * 40, add_special=True)[:300]
async def one():
    eng.cache.clear()
    last[0] = None
    async for _ in eng.generate(toks, GenerationParams(max_tokens=65)):
        pass
    await eng.wait_reply_saves()
for _ in range(4):
    trio.run(one)
trio.run(eng.aclose)
print(json.dumps({"decode_step_ms": statistics.median(steps) * 1000, "gap_ms": statistics.median(gaps) * 1000,
                  "gap_ms_p90": sorted(gaps)[int(len(gaps) * 0.9)] * 1000, "steps": len(steps)}))
"""


def main() -> None:
    trees = sys.argv[1:3]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    out: dict[str, list[dict[str, float]]] = {t: [] for t in trees}
    for r in range(rounds):
        for t in trees if r % 2 == 0 else trees[::-1]:
            p = subprocess.run([sys.executable, "-c", CHILD], cwd=t, env={**os.environ, "PYTHONPATH": t},
                               capture_output=True, text=True, check=True)
            out[t].append({k: round(v, 3) for k, v in json.loads(p.stdout.strip().splitlines()[-1]).items()})
    summary = {t: {k: round(statistics.median(x[k] for x in rows), 3) for k in ("decode_step_ms", "gap_ms", "gap_ms_p90")}
               for t, rows in out.items()}
    print(json.dumps({"rounds": out, "median_of_rounds": summary}, indent=1))


if __name__ == "__main__":
    main()
