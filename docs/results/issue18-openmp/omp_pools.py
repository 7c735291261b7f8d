"""Decode speed with one and with two OpenMP thread pools in a process (issue 18).

Each case runs in a fresh child process, alternating, three times each:
  raw-alone        llama-cpp-python's Llama, nothing else in the process
  raw-after-engine the same, after a LlamaCppEngine decoded on its slot-loop thread (two pools)
  engine-before    LlamaCppEngine at BEFORE (its constructor's probe decode on the caller's thread)
  engine-after     LlamaCppEngine at AFTER (the probe on a thread that ends)
A 300-token prompt, 64 greedy tokens, 2 threads, repacking off; ms per token.

usage: python omp_pools.py BEFORE_TREE AFTER_TREE > omp-pools.json
"""
import json, os, subprocess, sys, time

CHILD = r'''
import json, os, sys, time, trio
from p2pinfer.engines import GenerationParams, GenerationRecord
from p2pinfer.engines.llama_cpp import LlamaCppEngine
from p2pinfer.engines.llama_runtime import plain_llama
from p2pinfer.engines.model_files import default_model_path
case = sys.argv[1]
model = str(default_model_path())
engine = LlamaCppEngine(model, context_size=4096, threads=2, slots=8) if case != "raw-alone" else None
prompt = None
async def gen(tokens):
    engine.cache.clear()
    stamps = []
    t0 = time.perf_counter()
    async for item in engine.generate(tokens, GenerationParams(max_tokens=64)):
        if not isinstance(item, GenerationRecord):
            stamps.append(time.perf_counter())
    await engine.wait_reply_saves()
    return (stamps[0] - t0) * 1000 / len(tokens), (stamps[-1] - stamps[0]) * 1000 / (len(stamps) - 1)
text = "The quick brown fox jumps over the lazy dog. " * 30
rows = []
if case.startswith("engine"):
    tokens = engine.tokenize(text)[:300]
    for k in range(3):
        rows.append(trio.run(gen, [t + k for t in tokens]))
else:
    if engine is not None:
        trio.run(gen, engine.tokenize(text)[:300])  # the slot loop's pool now exists
    llm = plain_llama(model, n_ctx=4096, n_threads=2, n_threads_batch=2, verbose=False)
    tokens = llm.tokenize(text.encode())[:300]
    for k in range(3):
        llm.reset()
        t0 = time.perf_counter(); llm.eval(tokens); t1 = time.perf_counter()
        tok = llm.sample(temp=0); td = time.perf_counter()
        for i in range(63):
            llm.eval([tok]); tok = llm.sample(temp=0)
        rows.append(((t1 - t0) * 1000 / len(tokens), (time.perf_counter() - td) * 1000 / 63))
print(json.dumps(rows))
os._exit(0)
'''

def main() -> None:
    before, after = sys.argv[1], sys.argv[2]
    commit = lambda tree: subprocess.run(["git", "-C", tree, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    cases = {"raw-alone": after, "raw-after-engine": after, "engine-before": before, "engine-after": after}
    out = {name: [] for name in cases}
    for rep in range(3):
        for name, tree in cases.items():
            env = dict(os.environ, PYTHONPATH=tree)
            tree = os.path.abspath(tree)
            done = subprocess.run([sys.executable, "-c", CHILD, name], env=env, cwd=tree, capture_output=True, text=True, check=True)  # cwd: -c puts it first on sys.path
            out[name] += json.loads(done.stdout.strip().splitlines()[-1])
    med = lambda xs: sorted(xs)[len(xs) // 2]
    summary = {name: {"prefill_ms_per_token": round(med([p for p, _ in rows]), 2),
                      "decode_ms_per_token": round(med([d for _, d in rows]), 2),
                      "decode_range": [round(min(d for _, d in rows), 2), round(max(d for _, d in rows), 2)],
                      "runs": len(rows)} for name, rows in out.items()}
    print(json.dumps({"benchmark": "openmp-pools", "summary": summary, "raw": out,
                      "provenance": {"command": "python docs/results/issue18-openmp/omp_pools.py " + " ".join(sys.argv[1:]),
                                     "before_commit": commit(before), "after_commit": commit(after),
                                     "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                     "load_average": os.getloadavg()}}, indent=1))

main()
