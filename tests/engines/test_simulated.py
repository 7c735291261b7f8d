"""The simulated engine (a cost model with a real radix cache)."""

from __future__ import annotations

import trio
import trio.testing

from p2pinfer.core.costmodel import EngineCostModel
from p2pinfer.engines.base import GenerationParams, GenerationRecord
from p2pinfer.engines.simulated import SimulatedEngine


async def test_load_counts_the_request_in_prefill_and_the_ones_waiting(autojump_clock: trio.testing.MockClock) -> None:
    # On trio's autojump clock the engine's modelled prefill (a trio.sleep) and
    # the test's own sleeps share one virtual time: "50 ms into a 200 ms
    # prefill" holds however slow or fast the machine is.
    engine = SimulatedEngine(cost=EngineCostModel(prefill_ms_per_token=2.0))
    first, second = list(range(1, 101)), list(range(1, 51)) + list(range(500, 530))
    records: list[GenerationRecord] = []

    async def run(tokens: list[int]) -> None:
        async for item in engine.generate(tokens, GenerationParams(max_tokens=1)):
            if isinstance(item, GenerationRecord):
                records.append(item)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run, first)
        await trio.sleep(0.05)  # the first is in its 200 ms prefill
        assert engine.load().queued_prefill_tokens == 100 and engine.load().active_requests == 1
        nursery.start_soon(run, second)
        await trio.sleep(0.05)
        # The second's 50-token prefix is not cached yet, but the first will
        # have cached it when the second starts: only its last 30 tokens count.
        assert engine.load().queued_prefill_tokens == 130
    assert engine.load().queued_prefill_tokens == 0 and engine.load().active_requests == 0
    assert [r.reused_tokens for r in records] == [0, 50]  # once in service, it reused the first's prefix


async def test_a_queued_prompt_keeps_its_cached_prefix_while_the_prompts_ahead_fill_the_cache(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Issue 22: the cache holds prefixes A (used first) and D (used later).
    # A request for A arrives while a cold prompt B is in prefill: when B is
    # cached, the LRU must drop D, not A, which a request in the queue is
    # about to reuse (admission marks it used).
    engine = SimulatedEngine(cost=EngineCostModel(prefill_ms_per_token=2.0), cache_tokens=140)
    a, d, b = list(range(1, 65)), list(range(1000, 1064)), list(range(2000, 2064))
    records: list[tuple[int, int]] = []

    async def run(tokens: list[int]) -> None:
        async for item in engine.generate(tokens, GenerationParams(max_tokens=1)):
            if isinstance(item, GenerationRecord):
                records.append((tokens[0], item.reused_tokens))

    await run(a + [5000])
    await run(d + [5001])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run, b)
        await trio.sleep(0.05)  # B is in its prefill
        nursery.start_soon(run, a + [5002])
    assert records[-1] == (1, 64)  # the queued request reused all of A
    assert engine.cache.match(d, touch=False) < len(d)  # D went instead


async def test_a_stop_string_ends_the_answer_as_in_the_llama_cpp_engine(autojump_clock: trio.testing.MockClock) -> None:
    """``stop`` is honoured, not ignored: the text is cut before it and the answer ends there."""
    engine = SimulatedEngine(cost=EngineCostModel(prefill_ms_per_token=0.1, decode_ms_per_token=0.1))
    prompt = engine.tokenize("the quick brown fox jumps over the lazy dog " * 4)

    async def answer(params: GenerationParams) -> tuple[list[int], str, GenerationRecord]:
        ids: list[int] = []
        text: list[str] = []
        record = None
        async for item in engine.generate(prompt, params):
            if isinstance(item, GenerationRecord):
                record = item
            else:
                ids.extend(item.token_ids)
                text.append(item.text)
        assert record is not None
        return ids, "".join(text), record

    ids, full, record = await answer(GenerationParams(max_tokens=24))
    assert record.finish_reason == "length" and len(ids) == 24
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    assert stop.strip()
    cut_ids, cut, record = await answer(GenerationParams(max_tokens=24, stop=(stop,)))
    assert cut == full[: full.find(stop)]
    assert record.finish_reason == "stop" and len(cut_ids) < 24 and cut_ids == ids[: len(cut_ids)]
    assert record.generated_tokens == len(cut_ids)
