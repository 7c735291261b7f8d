"""Decode ms/token, one stream, SmolLM2, 2 threads: llama-cpp-python Llama and llama-batched-bench, flash attention on and off, alternating."""
import json, statistics as st, subprocess, sys, time
from llama_cpp import Llama
from p2pinfer.engines.model_files import default_model_path
from p2pinfer.provenance import with_provenance
M = str(default_model_path())
BB = "/work/build/llama-cpp-build/bin/llama-batched-bench"
def llama(fa):
    llm = Llama(M, n_ctx=4096, n_threads=2, n_threads_batch=2, flash_attn=fa, verbose=False)
    toks = llm.tokenize(("The history of astronomy is long. " * 40).encode())[:300]
    out = []
    for _ in range(2):
        llm.reset(); s = []
        for _t in llm.generate(toks, temp=0.0, reset=True):
            s.append(time.perf_counter())
            if len(s) >= 64: break
        g = [b - a for a, b in zip(s, s[1:])]
        out.append(round(1000 * st.median(g), 2))
    del llm
    return out
def bb(fa):
    r = subprocess.run([BB, "-m", M, "-c", "4096", "-b", "512", "-ub", "512", "-npp", "300", "-ntg", "64", "-npl", "1", "-t", "2", "-fa", fa], capture_output=True, text=True)
    row = [l for l in r.stdout.splitlines() if l.startswith("|") and l.split("|")[1].strip().isdigit()][-1].split("|")
    return round(1000 / float(row[8]), 2)  # S_TG t/s -> ms/token
res = {"benchmark": "flash-attention decode check", "model": M, "threads": 2, "prompt_tokens": 300, "tokens": 64, "rounds": []}
for rnd in range(2):
    for fa in ("on", "off"):
        res["rounds"].append({"flash_attn": fa, "llama_cpp_python_ms_per_token": llama(fa == "on"), "llama_batched_bench_ms_per_token": bb(fa)})
print(json.dumps(with_provenance(res)))
