"""``p2pinfer bench verify``: the tolerance that separates honest answers from wrong ones.

Real llama.cpp engines, MMLU five-shot prompts (the paper's workload), each
answered with ``max_tokens`` tokens. *Honest* answers come from SmolLM2
under two CPU configurations of a server (threads, batch size, flash
attention) and are scored (:meth:`~p2pinfer.engines.base.Engine.score`) by
verifiers under two others, so every pair differs in build settings;
*wrong* answers are the second test model's (Gemma 3 270M, re-tokenised:
:mod:`p2pinfer.lab.wrong_tokens`), SmolLM2's own with its weights cut to 3
and to 2 bits (``truncated-3bit``, ``truncated-2bit``: the right model at a
lower precision) and random tokens. For greedy answers it
reports, per answer, the largest shortfall of a returned token from the
verifier's argmax (nats): the honest maximum against the wrong answers'
distribution. For sampled answers (temperature ``temperature``, seeded) the
z-score of :func:`p2pinfer.core.verify.judge`'s log-likelihood test.

Every engine keeps a prefix cache, as a live node's does: a verifier that
holds the five-shot header checks only the question and the answer, which
is both what a live origin does and what makes a thousand honest checks fit
in half an hour of a 2-core machine (``subjects`` limits the headers).
"""

from __future__ import annotations

from dataclasses import replace
import random
import time
from typing import Any

import trio

from ..stats import summary

CONFIGS: dict[str, dict[str, Any]] = {
    "t2-b128": {"threads": 2, "batch_size": 128, "flash_attn": False},
    "t1-b64-flash": {"threads": 1, "batch_size": 64, "flash_attn": True},
    "t1-b128": {"threads": 1, "batch_size": 128, "flash_attn": False},
    "t2-b512-flash": {"threads": 2, "batch_size": 512, "flash_attn": True},
}
SERVERS = ("t2-b128", "t1-b64-flash")
VERIFIERS = ("t1-b128", "t2-b512-flash")


async def _answer(engine: Any, tokens: list[int], params: Any) -> list[int]:
    from ..engines.base import TokenChunk

    out: list[int] = []
    async for item in engine.generate(tokens, params):
        if isinstance(item, TokenChunk):
            out.extend(item.token_ids)
    return out


async def _measure(prompts: int, max_tokens: int, seed: int, temperature: float, subjects: int, cache_tokens: int) -> dict[str, Any]:
    from ..core.verify import VerifyConfig, judge
    from ..engines.base import GenerationParams
    from ..engines.llama_cpp import LlamaCppEngine
    from ..workloads.mmlu import MMLUWorkload, five_shot_header, load_mmlu
    from .wrong_tokens import WrongTokenEngine

    rng = random.Random(seed)
    chosen = load_mmlu()
    if subjects:
        # The shortest five-shot headers, as `bench swarm` takes them.
        chosen = sorted(chosen, key=lambda s: len(five_shot_header(s)))[:subjects]
    work = MMLUWorkload(chosen, seed=seed)
    texts = ["".join(p.parts) for p in work.prompts(prompts, rng)]
    engines = {name: LlamaCppEngine(context_size=4096, cache_tokens=cache_tokens, **opts) for name, opts in CONFIGS.items()}
    liar = WrongTokenEngine(engines["t2-b128"], "other-model", seed=seed)
    truncated = {f"truncated-{b}bit": WrongTokenEngine(engines["t2-b128"], "truncated-precision", truncated_bits=b) for b in (3, 2)}
    greedy = GenerationParams(max_tokens=max_tokens)
    sampled = GenerationParams(max_tokens=max_tokens, temperature=temperature, top_k=40, top_p=0.95)
    config = VerifyConfig()
    honest_gaps: list[float] = []
    honest_gap_by_pair: dict[str, list[float]] = {}
    honest_z: list[float] = []
    wrong: dict[str, dict[str, list[float]]] = {k: {"gap": [], "z": []} for k in ("other-model", *truncated, "random")}
    flips = 0
    same: dict[str, int] = {}
    """Wrong answers token for token equal to the first server's honest one (no check can tell them apart)."""
    t0 = time.perf_counter()
    try:
        for i, text in enumerate(texts):
            prompt = engines["t2-b128"].tokenize(text)
            answers = {s: await _answer(engines[s], prompt, greedy) for s in SERVERS}
            if answers[SERVERS[0]] != answers[SERVERS[1]]:
                flips += 1
            for s in SERVERS:
                if not answers[s]:
                    continue
                for v in VERIFIERS:
                    scores = await engines[v].score(prompt + answers[s], len(prompt))
                    gap = max(x.best_logprob - x.logprob for x in scores)
                    honest_gaps.append(gap)
                    honest_gap_by_pair.setdefault(f"{s} scored by {v}", []).append(gap)
            drawn = await _answer(engines[SERVERS[0]], prompt, replace(sampled, seed=seed + i))
            if drawn:
                for v in VERIFIERS:
                    scores = await engines[v].score(prompt + drawn, len(prompt), temperature=temperature)
                    honest_z.append(judge(scores, sampled, config).statistic)
            other = await liar._wrong_answer(prompt, greedy)
            rand = [rng.randrange(engines["t2-b128"].vocab_size) for _ in range(max_tokens)]
            cut = {k: await e._wrong_answer(prompt, greedy) for k, e in truncated.items()}
            for kind, answer in (("other-model", other), *cut.items(), ("random", rand)):
                if not answer:
                    continue
                same[kind] = same.get(kind, 0) + (answer == answers[SERVERS[0]])
                v = engines[VERIFIERS[0]]
                scores = await v.score(prompt + answer, len(prompt))
                wrong[kind]["gap"].append(max(x.best_logprob - x.logprob for x in scores))
                scores = await v.score(prompt + answer, len(prompt), temperature=temperature)
                wrong[kind]["z"].append(judge(scores, sampled, config).statistic)
    finally:
        for wrapper in (liar, *truncated.values()):
            if wrapper.other is not None:
                await wrapper.other.aclose()
        for e in engines.values():
            await e.aclose()
    tol = config.greedy_tolerance
    return {
        "benchmark": "verify",
        "engine": "llama-cpp (real), SmolLM2-135M-Instruct Q4_1; wrong model Gemma 3 270M Q4_K_M; "
                  "SmolLM2 with its Q4_1 weights cut to 3 and 2 bits (lab/wrong_tokens.py truncated_model)",
        "workload": "MMLU five-shot prompts",
        "prompts": prompts,
        "subjects": [s.name for s in chosen] if subjects else "all",
        "cache_tokens_per_engine": cache_tokens,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "seed": seed,
        "configs": CONFIGS,
        "servers": list(SERVERS),
        "verifiers": list(VERIFIERS),
        "greedy_answers_that_differ_between_servers": flips,
        "greedy_tolerance_nats": tol,
        "honest_max_gap_nats": summary(honest_gaps),
        "honest_max_gap_by_pair": {k: summary(v) for k, v in honest_gap_by_pair.items()},
        "honest_greedy_rejected": sum(1 for g in honest_gaps if g > tol),
        "wrong_max_gap_nats": {k: summary(v["gap"]) for k, v in wrong.items()},
        "wrong_greedy_caught": {k: sum(1 for g in v["gap"] if g > tol) for k, v in wrong.items()},
        "wrong_answers": {k: len(v["gap"]) for k, v in wrong.items()},
        "wrong_answers_equal_to_honest": same,
        "sampling_z_threshold": -config.sampling_z,
        "honest_sampled_z": summary(honest_z),
        "honest_sampled_rejected": sum(1 for z in honest_z if z < -config.sampling_z),
        "honest_checks": len(honest_gaps) + len(honest_z),
        "false_accusations": sum(1 for g in honest_gaps if g > tol) + sum(1 for z in honest_z if z < -config.sampling_z),
        "wrong_z_if_sampled": {k: summary(v["z"]) for k, v in wrong.items()},
        "wrong_caught_if_sampled": {k: sum(1 for z in v["z"] if z < -config.sampling_z) for k, v in wrong.items()},
        "wall_s": round(time.perf_counter() - t0, 1),
    }


def run_verify_tolerance(
    prompts: int = 20, max_tokens: int = 16, seed: int = 1, temperature: float = 0.8, subjects: int = 0, cache_tokens: int = 16384,
) -> dict[str, Any]:
    """``subjects`` 0: every MMLU subject; else the ``subjects`` with the shortest headers."""
    return trio.run(_measure, prompts, max_tokens, seed, temperature, subjects, cache_tokens)
