"""The property the prefix cache's exactness rests on, checked on the real model:
a prompt token's result does not depend on how the prompt was cut into batches,
nor on whether its prefix was evaluated here or restored from saved spans."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from p2pinfer.lab.engine_bench import bench_texts
from p2pinfer.engines.llama_runtime import LlamaRuntime
from p2pinfer.engines.model_files import default_model_path

pytestmark = pytest.mark.model


@pytest.fixture(scope="module", params=[(128, False), (32, True)], ids=["engine-default", "flash-attn-batch32"])
def rt(request: pytest.FixtureRequest) -> Iterator[LlamaRuntime]:
    """The engine's CPU defaults (flash attention off, batches of 128), and
    flash attention with small batches, where it holds only because prompt
    tokens never go through a one-token batch."""
    n_batch, flash = request.param
    runtime = LlamaRuntime(
        str(default_model_path()), n_ctx=1024, n_batch=n_batch, n_gpu_layers=0, n_threads=2, flash_attn=flash
    )
    try:
        yield runtime
    finally:
        runtime.close()


@pytest.fixture(scope="module")
def prompt(rt: LlamaRuntime) -> list[int]:
    # long enough (over 256 cells) for llama.cpp to split one-token attention across threads
    texts = bench_texts()
    text = next(texts)[0] + next(texts)[0]
    tokens = rt.tokenize(text, add_special=False)[:400]
    assert len(tokens) == 400
    return tokens


@pytest.fixture(scope="module")
def reference(rt: LlamaRuntime, prompt: list[int]) -> bytes:
    return _last_logits(rt, prompt, [])


def _last_logits(rt: LlamaRuntime, prompt: list[int], cuts: list[int]) -> bytes:
    rt.clear()
    prev = 0
    for cut in [*cuts, len(prompt)]:
        index = rt.prefill(prompt[prev:cut], prev)
        prev = cut
    return rt.logits(index)


def test_chunks_never_leave_one_token_alone() -> None:
    class _Shape:
        n_batch = 32

    chunks = LlamaRuntime.chunks
    assert chunks(_Shape(), 33) == [(0, 31), (31, 2)]  # type: ignore[arg-type]
    assert chunks(_Shape(), 64) == [(0, 32), (32, 32)]  # type: ignore[arg-type]
    assert chunks(_Shape(), 1) == [(0, 1)]  # type: ignore[arg-type]
    for n in range(1, 200):
        parts = chunks(_Shape(), n)  # type: ignore[arg-type]
        assert sum(k for _, k in parts) == n and all(k >= 2 for _, k in parts[1:])
        assert [o for o, _ in parts] == [sum(k for _, k in parts[:i]) for i in range(len(parts))]


@pytest.mark.parametrize("cuts", [[367], [100, 250], [398]])
def test_batch_boundaries_do_not_change_the_result(
    rt: LlamaRuntime, prompt: list[int], reference: bytes, cuts: list[int]
) -> None:
    assert _last_logits(rt, prompt, cuts) == reference


def test_restored_spans_give_the_same_result_as_evaluating(
    rt: LlamaRuntime, prompt: list[int], reference: bytes
) -> None:
    rt.clear()
    rt.prefill(prompt[:350], 0)
    first = rt.save_span(0, 350)
    second = rt.save_span(160, 350)
    rt.clear()
    assert rt.restore([(first, 0, 160), (second, 160, 317)]) == 317
    assert rt.work_len() == 317
    index = rt.prefill(prompt[317:], 317)
    assert rt.logits(index) == reference
    rt.clear()
