"""Engine.score: one prefill gives every position's scores (the answer check's input, core/verify.py)."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from p2pinfer.core.verify import VerifyConfig, judge
from p2pinfer.engines.base import GenerationParams, InvalidRequestError, TokenChunk
from p2pinfer.engines.simulated import SimulatedEngine


async def answer(engine: Any, tokens: list[int], params: GenerationParams) -> tuple[list[int], list[float]]:
    out: list[int] = []
    lps: list[float] = []
    async for item in engine.generate(tokens, params):
        if isinstance(item, TokenChunk):
            out.extend(item.token_ids)
            lps.extend(lp.logprob for lp in item.logprobs)
    return out, lps


async def test_the_llama_engines_own_greedy_answer_scores_as_argmax_with_the_logprobs_it_reported(engine: Any) -> None:
    prompt = engine.tokenize("The capital of France is Paris. The capital of Italy is")
    out, lps = await answer(engine, prompt, GenerationParams(max_tokens=12, logprobs=True))
    assert len(out) >= 4
    scores = await engine.score(prompt + out, len(prompt))
    assert [s.token_id for s in scores] == out
    for s, lp in zip(scores, lps):
        assert s.best_logprob - s.logprob < VerifyConfig().greedy_tolerance
        # One prefill or step by step: the same model, rounded differently (measured: up to about 0.1 nats).
        assert abs(s.logprob - lp) < VerifyConfig().greedy_tolerance
        assert s.mean_logprob <= 0 and s.var_logprob >= 0
    assert judge(scores, GenerationParams(), VerifyConfig()).ok
    assert engine.cache.total_tokens == len(prompt)  # scoring neither used nor changed the cache beyond the request


async def test_llama_random_tokens_fail_the_greedy_check(engine: Any) -> None:
    import random

    prompt = engine.tokenize("Once upon a time, there was a little girl who")
    rng = random.Random(5)
    wrong = [rng.randrange(engine.vocab_size) for _ in range(8)]
    scores = await engine.score(prompt + wrong, len(prompt))
    verdict = judge(scores, GenerationParams(), VerifyConfig())
    assert not verdict.ok and verdict.verified_tokens == 0
    assert not judge(await engine.score(prompt + wrong, len(prompt), temperature=0.8),
                     GenerationParams(temperature=0.8), VerifyConfig()).ok


async def test_llama_score_refuses_bad_calls(engine: Any) -> None:
    prompt = engine.tokenize("Hello there")
    with pytest.raises(InvalidRequestError, match="start"):
        await engine.score(prompt, 0)
    with pytest.raises(InvalidRequestError, match="start"):
        await engine.score(prompt, len(prompt))
    with pytest.raises(InvalidRequestError, match="vocabulary"):
        await engine.score(prompt + [engine.vocab_size], len(prompt))
    with pytest.raises(InvalidRequestError, match="temperature"):
        await engine.score(prompt + prompt, len(prompt), temperature=0.0)


async def test_simulated_scores_follow_its_generation_and_count_in_its_load() -> None:
    engine = SimulatedEngine(speed=1.0)
    prompt = list(range(300, 700))
    out, _ = await answer(SimulatedEngine(speed=0.0), prompt, GenerationParams(max_tokens=6))
    seen: list[int] = []

    async def watch() -> None:
        while True:
            seen.append(engine.load().queued_prefill_tokens)
            await trio.sleep(0.001)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch)
        scores = await engine.score(prompt + out, len(prompt))
        nursery.cancel_scope.cancel()
    assert max(seen) == len(prompt) + len(out)  # the check's prefill is queued work, reported as such
    assert engine.load().queued_prefill_tokens == 0
    assert all(s.best_token == s.token_id for s in scores)
    assert judge(scores, GenerationParams(), VerifyConfig()).ok
    wrong = await engine.score(prompt + [1, 2, 3], len(prompt))
    assert not judge(wrong, GenerationParams(), VerifyConfig()).ok
