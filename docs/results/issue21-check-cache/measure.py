"""Answer-check cost on one llama.cpp engine, cold against with the prompt cached.

Run from the repository root: ``flock /work/notes/bench.lock python
docs/results/issue21-check-cache/measure.py --prompts 6 --out docs/results/issue21-check-cache/run1.json``.
For each MMLU five-shot prompt (the paper's workload): a greedy answer of
``--max-tokens`` tokens (which caches the prompt), then ``Engine.score`` of
prompt + answer with the prompt cached ("warm"), then the cache emptied and
the same check again ("cold"); each timed alone on an idle engine, side by
side, prompt by prompt. Also records whether the verdicts agree and the
largest difference of the scored log-probabilities.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from typing import Any

import trio


async def main(prompts: int, max_tokens: int, seed: int) -> dict[str, Any]:
    from p2pinfer.core.verify import VerifyConfig, judge
    from p2pinfer.engines.base import GenerationParams, TokenChunk
    from p2pinfer.engines.llama_cpp import LlamaCppEngine
    from p2pinfer.workloads.mmlu import MMLUWorkload, load_mmlu

    rng = random.Random(seed)
    work = MMLUWorkload(load_mmlu(), seed=seed)
    texts = ["".join(p.parts) for p in work.prompts(prompts, rng)]
    engine = LlamaCppEngine(context_size=4096, reply_cache=False)
    rows = []
    try:
        for text in texts:
            engine.cache.clear()
            prompt = engine.tokenize(text)
            out: list[int] = []
            async for item in engine.generate(prompt, GenerationParams(max_tokens=max_tokens)):
                if isinstance(item, TokenChunk):
                    out.extend(item.token_ids)
            tokens = prompt + out
            r0, p0 = engine.check_tokens_reused, engine.check_tokens_prefilled
            t0 = time.perf_counter()
            warm = await engine.score(tokens, len(prompt))
            warm_s = time.perf_counter() - t0
            r1, p1 = engine.check_tokens_reused, engine.check_tokens_prefilled
            engine.cache.clear()
            t0 = time.perf_counter()
            cold = await engine.score(tokens, len(prompt))
            cold_s = time.perf_counter() - t0
            p2 = engine.check_tokens_prefilled
            rows.append({
                "prompt_tokens": len(prompt), "answer_tokens": len(out),
                "warm_s": warm_s, "cold_s": cold_s,
                "warm_reused_tokens": r1 - r0, "warm_prefilled_tokens": p1 - p0, "cold_prefilled_tokens": p2 - p1,
                "verdicts_equal": judge(warm, GenerationParams(), VerifyConfig()) == judge(cold, GenerationParams(), VerifyConfig()),
                "max_logprob_diff": max(abs(a.logprob - b.logprob) for a, b in zip(warm, cold)),
            })
            print(json.dumps(rows[-1]), file=sys.stderr)
    finally:
        await engine.aclose()
    ratios = [r["warm_s"] / r["cold_s"] for r in rows]
    return {
        "what": "answer check (Engine.score) cost, prompt cached (warm) against cold, llama-cpp SmolLM2-135M Q4_1",
        "prompts": prompts, "max_tokens": max_tokens, "seed": seed,
        "rows": rows,
        "median_warm_s": statistics.median(r["warm_s"] for r in rows),
        "median_cold_s": statistics.median(r["cold_s"] for r in rows),
        "warm_over_cold": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)},
        "all_verdicts_equal": all(r["verdicts_equal"] for r in rows),
        "max_logprob_diff": max(r["max_logprob_diff"] for r in rows),
    }


if __name__ == "__main__":
    from p2pinfer.provenance import with_provenance

    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--seed", type=int, default=21)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    result = trio.run(main, a.prompts, a.max_tokens, a.seed)
    with open(a.out, "w") as f:
        json.dump(with_provenance(result, sys.argv), f, indent=2)
        f.write("\n")
