"""The properties the engine's exactness rests on, checked on the real model:

* a prompt token's result does not depend on how the prompt was cut into
  batches, nor on whether its prefix was evaluated here or restored from
  saved spans (the prefix cache);
* a sequence's logits do not depend on the other sequences of the context:
  what they hold, how long they are, whether they decode in the same
  ``llama_decode`` (continuous batching), in which slot it sits.
"""

from __future__ import annotations

from collections.abc import Iterator
import random

import pytest

from p2pinfer.lab.engine_bench import bench_texts
from p2pinfer.engines.kv_state import KvFormatError, encode, parse
from p2pinfer.engines.llama_runtime import LlamaRuntime, RestoreError
from p2pinfer.engines.model_files import default_model_path

pytestmark = pytest.mark.model

SLOTS = 4


@pytest.fixture(scope="module", params=[(128, False), (32, True)], ids=["engine-default", "flash-attn-batch32"])
def rt(request: pytest.FixtureRequest) -> Iterator[LlamaRuntime]:
    """The engine's CPU defaults (flash attention off, batches of 128), and
    flash attention with small batches, where cut-invariance holds only
    because prompt tokens never go through a one-token batch."""
    n_batch, flash = request.param
    runtime = LlamaRuntime(
        str(default_model_path()), n_ctx=1024, n_batch=n_batch, n_gpu_layers=0, n_threads=2, flash_attn=flash,
        n_seq=SLOTS,
    )
    try:
        yield runtime
    finally:
        runtime.close()


@pytest.fixture(scope="module")
def texts(rt: LlamaRuntime) -> list[list[int]]:
    """Token sequences of real MMLU text, each starting differently."""
    out: list[list[int]] = []
    for shared, _ in bench_texts():
        tokens = rt.tokenize(shared.split("\n\n", 1)[-1], add_special=False)  # without the subjects' shared intro
        if len(tokens) >= 600 and all(t[:4] != tokens[:4] for t in out):
            out.append(tokens[:600])
        if len(out) == 6:
            return out
    raise AssertionError("not enough MMLU text")


@pytest.fixture(scope="module")
def prompt(texts: list[list[int]]) -> list[int]:
    # long enough (over 256 cells) for llama.cpp to split one-token attention across threads
    return texts[0][:400]


@pytest.fixture(scope="module")
def reference(rt: LlamaRuntime, prompt: list[int]) -> bytes:
    return _last_logits(rt, prompt, [])


def _last_logits(rt: LlamaRuntime, prompt: list[int], cuts: list[int], seq: int = 0) -> bytes:
    rt.clear()
    prev = 0
    for cut in [*cuts, len(prompt)]:
        index = rt.prefill(prompt[prev:cut], prev, seq=seq)
        prev = cut
    return rt.logits(index)


def _greedy(rt: LlamaRuntime, logits: bytes) -> int:
    import numpy as np

    return int(np.frombuffer(logits, dtype=np.float32).argmax())


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


def test_every_slot_gives_the_same_result(rt: LlamaRuntime, prompt: list[int], reference: bytes) -> None:
    for seq in range(1, SLOTS):
        assert _last_logits(rt, prompt, [], seq=seq) == reference


def test_the_state_codec_reads_and_writes_llama_cpps_own_blobs(rt: LlamaRuntime, prompt: list[int]) -> None:
    import ctypes

    import llama_cpp as ll

    rt.clear()
    rt.prefill(prompt[:50], 0, seq=2)
    size = ll.llama_state_seq_get_size(rt.ctx, 2)
    blob = bytearray(size)
    assert ll.llama_state_seq_get_data(rt.ctx, (ctypes.c_uint8 * size).from_buffer(blob), size, 2) == size
    span = parse(blob)
    assert (span.start, span.end, span.layout.n_stream) == (0, 50, SLOTS)
    assert span.nbytes == 50 * rt.layout.bytes_per_token
    again = encode([(span, 0, 50)], span.layout)
    assert len(again) == len(blob)
    # llama.cpp's blob names stream 2, ours the first stream: otherwise the same data
    back = parse(again)
    assert (back.start, back.end) == (0, 50)
    assert all((x == y).all() for x, y in zip(back.k + back.v, span.k + span.v))
    # theirs: header, cell counts 0, 0, 50, then the cells, then 0; ours: header, 50, the cells, 0, 0, 0
    meta = 50 * 12
    assert blob[12:24] == (0).to_bytes(4, "little") * 2 + (50).to_bytes(4, "little")
    assert again[12:16] == (50).to_bytes(4, "little") and again[-12:] == bytes(12) and blob[-4:] == bytes(4)
    assert again[16 + meta : -12] == blob[24 + meta : -4]
    with pytest.raises(KvFormatError):
        parse(blob[:-1])
    with pytest.raises(KvFormatError):
        parse(b"\x00" * 64)
    rt.clear()


def test_restored_spans_give_the_same_result_as_evaluating(
    rt: LlamaRuntime, prompt: list[int], reference: bytes
) -> None:
    rt.clear()
    rt.prefill(prompt[:350], 0, seq=1)
    first = rt.save_span(0, 350, seq=1)
    second = rt.save_span(160, 350, seq=1)
    rt.clear()
    # saved in slot 1, restored into slot 3, another prompt resident in slot 0
    rt.prefill(prompt[:90], 0, seq=0)
    assert rt.restore([(first, 0, 160), (second, 160, 317)], seq=3) == 317
    assert rt.seq_len(3) == 317
    index = rt.prefill(prompt[317:], 317, seq=3)
    assert rt.logits(index) == reference
    with pytest.raises(RestoreError):
        rt.restore([(second, 160, 200)], seq=3)  # does not start at position 0
    rt.clear()


def _decode_alone(rt: LlamaRuntime, tokens: list[int], seq: int, steps: int) -> list[bytes]:
    """Logits of the prompt's last token and of ``steps`` greedy decode steps, nothing else resident."""
    rt.clear()
    out = [rt.logits(rt.prefill(tokens, 0, seq=seq))]
    for i in range(steps):
        rt.decode([(seq, _greedy(rt, out[-1]), len(tokens) + i)])
        out.append(rt.logits(0))
    return out


def _beside_neighbours(rt: LlamaRuntime, texts: list[list[int]], mine: list[int], me: int, layout: str,
                       steps: int) -> list[bytes]:
    """``mine`` evaluated and decoded beside neighbours of other lengths, one
    llama_decode per step for all of them; neighbours leave and join on the way."""
    rng = random.Random(f"neighbours-{layout}")
    rt.clear()
    others = [s for s in range(SLOTS) if s != me]
    if layout == "gap":
        others = [0, 3]  # slot 1 stays empty: the step is two micro-batches
    nxt: dict[int, int] = {}
    for k, s in enumerate(others):
        nxt[s] = rng.randrange(40, 590)
        rt.prefill(texts[1 + k][: nxt[s]], 0, seq=s)
    got = [rt.logits(rt.prefill(mine, 0, seq=me))]
    for i in range(steps):
        # a neighbour leaves after step 2 and comes back (shorter) at step 4
        if i == 2:
            rt.clear_seq(others[0])
        if i == 4:
            nxt[others[0]] = 30
            rt.prefill(texts[5][:30], 0, seq=others[0])
        batch = [(s, 100 + s, nxt[s]) for s in others if not (i in (2, 3) and s == others[0])]
        for s, _, _ in batch:
            nxt[s] += 1
        batch.append((me, _greedy(rt, got[-1]), len(mine) + i))
        batch.sort()
        rt.decode(batch)
        got.append(rt.logits([s for s, _, _ in batch].index(me)))
    rt.clear()
    return got


@pytest.mark.parametrize("layout", ["consecutive", "gap", "last-slot"])
def test_decode_logits_do_not_depend_on_the_batch(rt: LlamaRuntime, texts: list[list[int]], layout: str) -> None:
    """The engine's guarantee (flash attention off, the CPU default): one
    sequence alone, then the same beside neighbours of other lengths that
    join and leave: every step's logits are bit-identical.

    With flash attention on, llama.cpp's CPU kernel for one query row per
    sequence splits the KV across threads depending on the whole batch, and
    the logits do change with the neighbours (measured); what still holds
    there is that the same batch gives the same bits every time."""
    me, steps = {"consecutive": 1, "gap": 2, "last-slot": SLOTS - 1}[layout], 6
    mine = texts[0][: random.Random(layout).randrange(120, 420)]
    got = _beside_neighbours(rt, texts, mine, me, layout, steps)
    if rt.flash_attn:
        assert _beside_neighbours(rt, texts, mine, me, layout, steps) == got
    else:
        assert [a == b for a, b in zip(got, _decode_alone(rt, mine, me, steps))] == [True] * (steps + 1)
