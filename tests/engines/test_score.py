"""Engine.score: one prefill gives every position's scores (the answer check's input, core/verify.py)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import trio
import trio.testing

from p2pinfer.core.verify import VerifyConfig, judge
from p2pinfer.engines.base import EngineError, GenerationParams, InvalidRequestError, TokenChunk
from p2pinfer.engines.simulated import SimulatedEngine


async def answer_and_record(engine: Any, tokens: list[int], params: GenerationParams) -> tuple[list[int], list[float], Any]:
    """The generated tokens, their logprobs, and the generation's record."""
    out: list[int] = []
    lps: list[float] = []
    record = None
    async for item in engine.generate(tokens, params):
        if isinstance(item, TokenChunk):
            out.extend(item.token_ids)
            lps.extend(lp.logprob for lp in item.logprobs)
        else:
            record = item
    return out, lps, record


async def answer(engine: Any, tokens: list[int], params: GenerationParams) -> tuple[list[int], list[float]]:
    out, lps, _ = await answer_and_record(engine, tokens, params)
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


async def test_simulated_scores_follow_its_generation_and_count_as_background_work(autojump_clock: trio.testing.MockClock) -> None:
    engine = SimulatedEngine(speed=1.0)
    prompt = list(range(300, 700))
    out, _ = await answer(SimulatedEngine(speed=0.0), prompt, GenerationParams(max_tokens=6))
    seen: list[tuple[int, int, int]] = []

    async def watch() -> None:
        while True:
            load = engine.load()
            seen.append((load.queued_prefill_tokens, engine.queue.background_queued, load.active_requests))
            await trio.sleep(0.001)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch)
        scores = await engine.score(prompt + out, len(prompt))
        nursery.cancel_scope.cancel()
    # the check's prefill is background work: not in the queued prefill a request's wait is predicted from
    assert max(q for q, _, _ in seen) == 0
    assert max(b for _, b, _ in seen) == len(prompt) + len(out) and max(a for _, _, a in seen) == 1
    assert engine.queue.background_queued == 0 and engine.load().active_requests == 0
    assert all(s.best_token == s.token_id for s in scores)
    assert judge(scores, GenerationParams(), VerifyConfig()).ok
    wrong = await engine.score(prompt + [1, 2, 3], len(prompt))
    assert not judge(wrong, GenerationParams(), VerifyConfig()).ok
    # the second check reuses the prompt the first one left cached
    assert (engine.check_tokens_reused, engine.check_tokens_prefilled) == (len(prompt) - 1, len(prompt) + len(out) + 4)


async def test_a_simulated_check_reads_the_cached_prompt_and_lets_a_request_go_between_its_chunks(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = SimulatedEngine(speed=1.0)
    prompt = list(range(300, 1300))
    async for _ in engine.generate(prompt, GenerationParams(max_tokens=1)):
        pass  # the prompt is cached now
    before = engine.cache.total_tokens
    scores = await engine.score(prompt + [5, 6], len(prompt))
    assert len(scores) == 2 and engine.cache.total_tokens == before  # the prompt was cached already
    assert (engine.check_tokens_reused, engine.check_tokens_prefilled) == (len(prompt) - 1, 3)
    engine.cache.clear()
    await engine.score(prompt[:500] + [5, 6], 500)
    assert engine.cache.match(prompt, touch=False) == 500  # a cold check leaves its prompt cached
    assert engine.cache.total_tokens == 500  # and not its answer
    engine.cache.clear()
    untouched = SimulatedEngine(speed=0.0, check_cache=False)  # the node setting check_cache off
    await untouched.score(prompt[:500] + [5, 6], 500)
    assert untouched.cache.total_tokens == 0
    done: dict[str, float] = {}

    async def check() -> None:
        await engine.score(prompt + [5, 6], len(prompt))  # cold: 8 chunks
        done["check"] = trio.current_time()

    async def request() -> None:
        await trio.sleep(0.01)  # arrives during the check's first chunk
        async for _ in engine.generate(list(range(5, 40)), GenerationParams(max_tokens=1)):
            done.setdefault("first token", trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(check)
        nursery.start_soon(request)
    assert done["first token"] < done["check"]


def _long_prompt(engine: Any, words: int | None = None) -> list[int]:
    """A prompt of about ``words`` words, or else of ten prefill batches and a bit
    (the CPU's; a GPU's larger batches: as many as fit in 3,800 tokens)."""
    count = words if words is not None else 6000
    text = " ".join(f"item {i} is {'red' if i % 3 else 'blue'}," for i in range(count // 4))
    tokens = engine.tokenize(text)
    return tokens if words is not None else tokens[: min(10 * engine.batch_size, 3800) + 40]


async def test_a_check_runs_in_chunks_while_a_stream_keeps_decoding(engine: Any) -> None:
    """A check is evaluated one chunk per loop iteration, so a decoding
    stream's longest gap between two tokens while it runs is about one chunk,
    well below the check's own duration (both measured here)."""
    check_tokens = _long_prompt(engine)
    assert len(check_tokens) == min(10 * engine.batch_size, 3800) + 40
    stamps: list[float] = []
    window: dict[str, float] = {}
    started = trio.Event()

    async def stream() -> None:
        params = GenerationParams(max_tokens=400)
        async for item in engine.generate(engine.tokenize("Once upon a time"), params):
            if isinstance(item, TokenChunk):
                stamps.append(time.perf_counter())
                if len(stamps) == 5:
                    started.set()
                if "end" in window:
                    return

    async def check() -> None:
        await started.wait()
        window["start"] = time.perf_counter()
        await engine.score(check_tokens, len(check_tokens) - 16)
        window["end"] = time.perf_counter()

    chunks0 = engine._loop.check_chunks
    async with trio.open_nursery() as nursery:
        nursery.start_soon(stream)
        nursery.start_soon(check)
    duration = window["end"] - window["start"]
    during = [t for t in stamps if window["start"] <= t <= window["end"]]
    gaps = [b - a for a, b in zip(during, during[1:])]
    # the prompt in a request's cuts (it is cached afterwards), then the answer's 16 tokens
    assert engine._loop.check_chunks - chunks0 == len(engine._rt.chunks(len(check_tokens) - 16)) + 1
    assert len(during) >= 4, (len(during), duration)  # it kept decoding during the check
    print(f"check {duration:.3f} s, {len(during)} tokens during it, longest gap {max(gaps):.3f} s")
    assert max(gaps) < duration / 3, (max(gaps), duration)


async def test_a_request_arriving_during_a_long_check_gets_its_first_token_before_the_check_ends(engine: Any) -> None:
    """Checks are background work: a request's prefill chunks go first."""
    check_tokens = _long_prompt(engine)
    prompt = engine.tokenize("The capital of France is Paris. The capital of Italy is")
    got: dict[str, float] = {}

    async def check() -> None:
        await engine.score(check_tokens, len(check_tokens) - 16)
        got["check done"] = time.perf_counter()

    async def request() -> None:
        while engine._loop.check_chunks == chunks0:  # the check has started evaluating
            await trio.sleep(0.001)
        got["load"] = engine.load().queued_prefill_tokens
        got["queued checks"] = engine.queue.background_queued
        async for item in engine.generate(prompt, GenerationParams(max_tokens=2)):
            if isinstance(item, TokenChunk):
                got.setdefault("first token", time.perf_counter())

    chunks0 = engine._loop.check_chunks
    async with trio.open_nursery() as nursery:
        nursery.start_soon(check)
        nursery.start_soon(request)
    print({k: v for k, v in got.items()})
    assert got["first token"] < got["check done"]
    # the check was queued work, but not in the prefill a new request's wait is predicted from
    assert got["load"] == 0 and got["queued checks"] == len(check_tokens)
    assert engine.queue.background_queued == 0 and engine.load().active_requests == 0


async def test_a_check_restores_the_cached_prompt_and_scores_as_a_cold_check(engine: Any) -> None:
    prompt = _long_prompt(engine, 200) + engine.tokenize(" The capital of Italy is", add_special=False)
    out, _ = await answer(engine, prompt, GenerationParams(max_tokens=12))
    assert len(out) >= 4 and engine.cache.match(prompt, touch=False) == len(prompt)
    tokens = prompt + out
    cache_before = engine.cache.total_tokens
    reused0, prefilled0 = engine.check_tokens_reused, engine.check_tokens_prefilled
    warm = await engine.score(tokens, len(prompt))
    cached = len(prompt) - 2  # the prompt's last two tokens are computed, as for a request
    assert engine.check_tokens_reused - reused0 == cached
    assert engine.check_tokens_prefilled - prefilled0 == len(tokens) - cached
    assert engine.cache.total_tokens == cache_before  # the prompt was cached already
    engine.cache.clear()
    reused0, prefilled0 = engine.check_tokens_reused, engine.check_tokens_prefilled
    cold = await engine.score(tokens, len(prompt))
    assert (engine.check_tokens_reused - reused0, engine.check_tokens_prefilled - prefilled0) == (0, len(tokens))
    assert engine.cache.match(tokens, touch=False) == len(prompt)  # the cold check left its prompt cached
    verdict = judge(warm, GenerationParams(), VerifyConfig())
    assert verdict.ok and verdict == judge(cold, GenerationParams(), VerifyConfig())
    assert [s.best_token for s in warm] == [s.best_token for s in cold] == out
    diff = max(abs(a.logprob - b.logprob) for a, b in zip(warm, cold))
    # Measured 0.0 on the CPU build (no flash attention: results do not depend on the batches);
    # other backends may round differently with other batch cuts.
    print(f"largest |warm - cold| logprob difference {diff}")
    assert diff < 1e-3, diff


async def test_a_cancelled_check_frees_its_slot_and_a_closed_engine_fails_a_running_check(engine: Any) -> None:
    check_tokens = _long_prompt(engine)
    chunks0 = engine._loop.check_chunks
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            async def cancel_once_started() -> None:
                while engine._loop.check_chunks == chunks0 or not engine._loop.checking:
                    await trio.sleep(0.001)
                scope.cancel()

            nursery.start_soon(cancel_once_started)
            await engine.score(check_tokens, len(check_tokens) - 4)
    assert scope.cancelled_caught
    while engine._loop.checking:  # it leaves its slot at the loop's next step
        await trio.sleep(0.001)
    assert engine._loop.check_chunks - chunks0 < len(engine._rt.chunks(len(check_tokens)))
    assert (engine.queue.background_queued, engine.queue.active, engine.queue.running) == (0, 0, 0)
    assert all(engine._rt.seq_len(i) == 0 for i in range(engine.slots))  # its sequence is empty again
    out, _ = await answer(engine, engine.tokenize("Hello"), GenerationParams(max_tokens=3))
    assert out

    from p2pinfer.engines.llama_cpp import LlamaCppEngine

    other = LlamaCppEngine(context_size=2048, cache_tokens=100, slots=2)
    long = _long_prompt(other)[:1500]
    failed: list[BaseException] = []

    async def check() -> None:
        try:
            await other.score(long, len(long) - 4)
        except EngineError as exc:
            failed.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(check)
        while other._loop.check_chunks == 0:
            await trio.sleep(0.001)
        await other.aclose()
    assert len(failed) == 1 and "closed" in str(failed[0])
    with pytest.raises(EngineError, match="closed"):
        await other.score(long, len(long) - 4)


async def test_a_check_running_when_the_slot_loop_dies_fails_explicitly() -> None:
    from p2pinfer.engines.llama_cpp import LlamaCppEngine

    class Crash(Exception):
        pass

    engine = LlamaCppEngine(context_size=2048, cache_tokens=100, slots=2)
    try:
        long = _long_prompt(engine)[:1500]
        real_decode = engine._rt.decode

        def crashing_decode(steps: Any) -> None:
            if engine._loop.check_chunks:
                raise Crash("injected: the worker crashed")
            real_decode(steps)

        engine._rt.decode = crashing_decode  # the stream's next decode step after the check's first chunk
        failed: list[BaseException] = []

        async def stream() -> None:
            try:
                async for _ in engine.generate(engine.tokenize("Once upon a time"), GenerationParams(max_tokens=200)):
                    pass
            except EngineError as exc:
                failed.append(exc)

        async def check() -> None:
            try:
                await engine.score(long, len(long) - 4)
            except EngineError as exc:
                failed.append(exc)

        with trio.fail_after(120):  # without the error path the check would wait forever
            async with trio.open_nursery() as nursery:
                nursery.start_soon(stream)
                nursery.start_soon(check)
        assert len(failed) == 2 and all("injected: the worker crashed" in str(e) for e in failed), failed
        with pytest.raises(EngineError, match="the engine failed"):
            await engine.score(long, len(long) - 4)
    finally:
        await engine.aclose()


@pytest.mark.parametrize("shape", ["answer of 12 tokens", "one answer token", "one answer token after full chunks"])
async def test_a_prompt_cached_by_a_check_serves_the_same_greedy_answer_as_a_cold_prefill(engine: Any, shape: str) -> None:
    """A check leaves its prompt cached (issue 21); a request then restoring that KV must get
    what a cold prefill gives, bit for bit (the engine's exactness guarantee), whatever the
    check's cuts around its answer (one answer token rides with the prompt's last chunk, or
    the last full chunk gives it a token)."""
    bs = engine.batch_size
    words = _long_prompt(engine, 400)
    prompt = words[: 2 * bs] if shape == "one answer token after full chunks" else words[: 2 * bs + 37]
    params = GenerationParams(max_tokens=12, logprobs=True)
    cold_out, cold_lps = await answer(engine, prompt, params)
    assert len(cold_out) >= 2
    engine.cache.clear()
    given = cold_out if shape == "answer of 12 tokens" else cold_out[:1]
    cached0 = engine.check_prompts_cached
    scores = await engine.score(prompt + given, len(prompt))
    assert [s.best_token for s in scores] == given
    assert engine.check_prompts_cached == cached0 + 1
    assert engine.cache.match(prompt + given, touch=False) == len(prompt)
    out, lps, record = await answer_and_record(engine, prompt, params)
    assert record.reused_tokens == len(prompt) - 2  # served from what the check left
    assert out == cold_out and lps == cold_lps


def test_the_node_setting_check_cache_reaches_the_engine_only_when_off() -> None:
    from p2pinfer.cli.node_cmd import engine_options
    from p2pinfer.cli.settings import resolve_settings

    default, _ = resolve_settings({}, env={})
    assert default.check_cache is True and "check_cache" not in engine_options(default)
    off, origin = resolve_settings({}, env={"P2PINFER_CHECK_CACHE": "0"})
    assert engine_options(off)["check_cache"] is False and origin["check_cache"] == "$P2PINFER_CHECK_CACHE"
