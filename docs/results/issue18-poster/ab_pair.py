"""Paired A/B through HTTP (issue 18): one node per source tree, both alive, single streaming requests alternating A/B. argv: TREE_A TREE_B PAIRS"""
import json, os, statistics, sys, time
import openai, trio
trees = sys.argv[1:3]; pairs = int(sys.argv[3])
from p2pinfer.lab.concurrency_bench import P2pinferNode, build_prompts
from p2pinfer.engines.model_files import default_model_path
from p2pinfer.engines.llama_cpp import LlamaCppEngine
path = str(default_model_path())
eng = LlamaCppEngine(path, context_size=1024, threads=1, slots=1)
prompts = build_prompts(eng, pairs)
trio.run(eng.aclose); del eng
nodes = []
for t in trees:
    os.environ["PYTHONPATH"] = t
    nodes.append(P2pinferNode(path, threads=2, context_size=4096, slots=8, reply_cache=False))
def one(node, prompt):
    client = openai.OpenAI(base_url=node.base_url, api_key="none", max_retries=0, timeout=600)
    t0 = time.perf_counter(); stamps = []
    for ch in client.chat.completions.create(model="default", messages=list(prompt.messages), max_tokens=64, temperature=0.0, stream=True):
        if ch.choices and ch.choices[0].delta.content:
            stamps.append(time.perf_counter())
    return (stamps[0] - t0) * 1000, (stamps[-1] - stamps[0]) * 1000 / (len(stamps) - 1), len(stamps)
res = {0: [], 1: []}
try:
    for n in nodes: one(n, prompts[0])
    for i, p in enumerate(prompts):
        order = (0, 1) if i % 2 == 0 else (1, 0)
        for k in order:
            res[k].append(one(nodes[k], p))
finally:
    for n in nodes: n.stop()
ratios_dec = [b[1] / a[1] for a, b in zip(res[0], res[1])]
ratios_ttft = [b[0] / a[0] for a, b in zip(res[0], res[1])]
q = lambda xs: [round(statistics.median(xs), 3), round(sorted(xs)[len(xs)//4], 3), round(sorted(xs)[3*len(xs)//4], 3)]
print(json.dumps({"A": trees[0], "B": trees[1], "pairs": len(ratios_dec),
  "decode_ms_A": q([r[1] for r in res[0]]), "decode_ms_B": q([r[1] for r in res[1]]),
  "B_over_A_decode_median_q1_q3": q(ratios_dec), "B_over_A_ttft": q(ratios_ttft)}))
