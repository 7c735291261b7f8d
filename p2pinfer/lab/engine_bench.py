"""``p2pinfer bench engine``: what a prefix-cache hit saves on the real engine.

Each repetition takes a fresh 1,070-token prefix of MMLU five-shot text and
two prompts that share it (30 more tokens each). Side by side, with the
cache emptied in between: the prompt cold; the other prompt (which caches
the prefix); the prompt again, warm. Cold and warm are the same prompt, so
the ratio is the cache's effect alone, and their greedy outputs must be
identical. The figures also calibrate
:class:`~p2pinfer.core.costmodel.EngineCostModel`.
"""

from __future__ import annotations

from collections.abc import Iterator
import time
from typing import Any

from ..stats import median


__all__ = ["bench_texts", "run_engine_bench"]

_FALLBACK = (
    "The following are notes on the history of science. Early astronomers measured the motion of the "
    "planets with simple instruments and long patience. Chemists learned to weigh what burned and what "
    "remained, and found that mass is conserved. Physicists described heat as motion, light as a wave "
    "and later as packets of energy. Biologists classified living things, then explained their variety "
    "by descent with modification. Each step replaced a vaguer idea with one that could be tested. "
)


def bench_texts() -> Iterator[tuple[str, list[str]]]:
    """(long shared text, short distinct questions) per MMLU subject.

    Real MMLU five-shot text from the packaged subset, else from
    ``/work/shared/data/mmlu``, else a built-in paragraph (numbered so that
    every repetition gets a different prefix).
    """
    subjects: list[Any] = []
    try:
        from ..workloads.mmlu import five_shot_header, format_question, load_mmlu

        for source in (None, "/work/shared/data/mmlu"):
            try:
                subjects = load_mmlu(source, max_test=8)
                break
            except (OSError, ValueError):
                continue
    except ImportError:
        subjects = []
    if subjects:
        for i, subject in enumerate(subjects):
            nxt = subjects[(i + 1) % len(subjects)]
            shared = five_shot_header(subject) + five_shot_header(nxt)
            yield shared, [format_question(q, with_answer=False) for q in subject.test]
        return
    i = 0
    while True:
        yield (
            f"Part {i}. " + _FALLBACK * 8,
            [f"Question {i}.{k}: which of these ideas came first, and why was it replaced?" for k in range(8)],
        )
        i += 1


def prompt_pairs(engine: Any, prefix_tokens: int, suffix_tokens: int, reps: int) -> list[tuple[list[int], list[int]]]:
    """(prompt, earlier prompt): same first ``prefix_tokens`` tokens, then they differ."""
    out: list[tuple[list[int], list[int]]] = []
    for shared, questions in bench_texts():
        prefix = engine.tokenize(shared)[:prefix_tokens]
        if len(prefix) < prefix_tokens:
            continue
        tails = [engine.tokenize(q, add_special=False)[:suffix_tokens] for q in questions]
        tails = [t for t in tails if len(t) == suffix_tokens]
        pick = next(
            ((a, b) for a in tails for b in tails if a[0] != b[0]),
            None,
        )
        if pick is None:
            continue
        out.append((prefix + pick[0], prefix + pick[1]))
        if len(out) == reps:
            return out
    raise RuntimeError("not enough text to build the benchmark prompts")


async def _generate(engine: Any, tokens: list[int], max_tokens: int) -> tuple[list[int], Any, list[float]]:
    from ..engines import GenerationParams, GenerationRecord

    out: list[int] = []
    stamps: list[float] = []
    record = None
    async for item in engine.generate(tokens, GenerationParams(max_tokens=max_tokens, temperature=0.0)):
        if isinstance(item, GenerationRecord):
            record = item
        else:
            stamps.append(time.perf_counter())
            out.extend(item.token_ids)
    await engine.wait_reply_saves()  # untimed: the next prompt does not run beside this one's reply save
    return out, record, stamps


async def run_engine_bench(
    engine: Any,
    *,
    prefix_tokens: int = 1070,
    suffix_tokens: int = 30,
    reps: int = 5,
    decode_tokens: int = 32,
) -> dict[str, Any]:
    """Measure ``reps`` cold/warm pairs on ``engine`` (its cache is emptied first)."""
    pairs = prompt_pairs(engine, prefix_tokens, suffix_tokens, reps)
    rows: list[dict[str, Any]] = []
    decode_ms: list[float] = []
    first_step_ms: list[float] = []
    for prompt, earlier in pairs:
        engine.cache.clear()
        cold_out, cold, _ = await _generate(engine, prompt, decode_tokens)
        engine.cache.clear()
        _, early, stamps = await _generate(engine, earlier, decode_tokens)
        warm_out, warm, warm_stamps = await _generate(engine, prompt, decode_tokens)
        for s in (stamps, warm_stamps):
            gaps = [b - a for a, b in zip(s[1:], s[2:])]
            if gaps:
                decode_ms.append(median(gaps) * 1000)
        if len(stamps) > 1:
            first_step_ms.append((stamps[1] - stamps[0]) * 1000)
        rows.append(
            {
                "cold_ttft_ms": round(cold.ttft_s * 1000, 2),
                "warm_ttft_ms": round(warm.ttft_s * 1000, 2),
                "warm_over_cold": round(warm.ttft_s / cold.ttft_s, 4),
                "reused_tokens": warm.reused_tokens,
                "cold_reused_tokens": cold.reused_tokens,
                # engines that do not break their TTFT down (simulated) count it all as prefill
                "restore_ms": warm.extra.get("restore_ms", 0.0),
                "warm_prefill_ms": warm.extra.get("prefill_ms", round(warm.ttft_s * 1000, 3)),
                "cold_prefill_ms": cold.extra.get("prefill_ms", round(cold.ttft_s * 1000, 3)),
                "greedy_identical": cold_out == warm_out and cold.finish_reason == warm.finish_reason,
                "cold_tokens_generated": len(cold_out),
            }
        )
    n_prompt = prefix_tokens + suffix_tokens
    cold_ms = [r["cold_ttft_ms"] for r in rows]
    warm_ms = [r["warm_ttft_ms"] for r in rows]
    prefill_per_token = [r["cold_prefill_ms"] / n_prompt for r in rows]
    capacity = engine.cache.capacity_tokens
    bpt = getattr(engine, "bytes_per_token", None)
    result: dict[str, Any] = {
        "benchmark": "engine",
        "engine": engine.describe(),
        "prompt_tokens": n_prompt,
        "shared_prefix_tokens": prefix_tokens,
        "repetitions": len(rows),
        "cold_ttft_ms": round(median(cold_ms), 2),
        "warm_ttft_ms": round(median(warm_ms), 2),
        "warm_over_cold": round(median([r["warm_over_cold"] for r in rows]), 4),
        "warm_over_cold_of_medians": round(median(warm_ms) / median(cold_ms), 4),
        "floor_over_cold": round(median([r["warm_prefill_ms"] for r in rows]) / median(cold_ms), 4),
        "reused_tokens": int(median([r["reused_tokens"] for r in rows])),
        "restore_ms": round(median([r["restore_ms"] for r in rows]), 3),
        "request_overhead_ms": round(
            median([r["warm_ttft_ms"] - r["restore_ms"] - r["warm_prefill_ms"] for r in rows]), 3
        ),
        "greedy_identical_all": all(r["greedy_identical"] for r in rows),
        "prefill_ms_per_token": round(median(prefill_per_token), 3),
        "decode_ms_per_token": round(median(decode_ms), 3),
        "first_step_ms_with_save": round(median(first_step_ms), 2),
        "cache_bytes_per_token": bpt,
        "cache_budget_tokens": capacity,
        "cache_budget_mib": round(capacity * bpt / (1 << 20), 1) if capacity and bpt else None,
        "distinct_prompts_fit": capacity // n_prompt if capacity else None,
        "prompts_sharing_the_prefix_fit": 1 + (capacity - n_prompt) // suffix_tokens
        if capacity and capacity >= n_prompt
        else None,
        "runs": rows,
    }
    return result


def naive_baseline(
    model_path: str,
    pairs: list[tuple[list[int], list[int]]],
    prefix_tokens: int,
    *,
    threads: int,
    context_size: int,
    flash_attn: bool,
) -> dict[str, Any]:
    """The naive prefix cache, side by side: ``Llama.save_state`` after the
    earlier prompt, ``load_state`` before the warm one (the whole context's
    state goes through Python both ways)."""
    from ..engines.llama_runtime import plain_llama

    llm = plain_llama(
        model_path, n_ctx=context_size, n_batch=512, n_threads=threads, n_threads_batch=threads,
        flash_attn=flash_attn, verbose=False,
    )
    rows = []
    try:
        for prompt, earlier in pairs:
            llm.reset()
            llm._ctx.kv_cache_clear()
            t0 = time.perf_counter()
            llm.eval(prompt)
            cold_s = time.perf_counter() - t0
            llm.reset()
            llm._ctx.kv_cache_clear()
            llm.eval(earlier)
            t0 = time.perf_counter()
            state = llm.save_state()
            save_s = time.perf_counter() - t0
            llm.reset()
            llm._ctx.kv_cache_clear()
            t0 = time.perf_counter()
            llm.load_state(state)
            llm.n_tokens = prefix_tokens
            llm._ctx.kv_cache_seq_rm(-1, prefix_tokens, -1)
            llm.eval(prompt[prefix_tokens:])
            warm_s = time.perf_counter() - t0
            rows.append((cold_s, warm_s, save_s, llm_state_size(state)))
    finally:
        llm.close()
    return {
        "method": "llama_cpp.Llama save_state/load_state of the whole context",
        "cold_ttft_ms": round(median([r[0] for r in rows]) * 1000, 2),
        "warm_ttft_ms": round(median([r[1] for r in rows]) * 1000, 2),
        "warm_over_cold": round(median([r[1] / r[0] for r in rows]), 4),
        "save_ms": round(median([r[2] for r in rows]) * 1000, 2),
        "state_bytes": int(median([r[3] for r in rows])),
    }


def live_sequences_experiment(
    model_path: str,
    pairs: list[tuple[list[int], list[int]]],
    prefix_tokens: int,
    *,
    threads: int,
    context_size: int,
    batch_size: int,
    flash_attn: bool | None,
    decode_tokens: int,
) -> dict[str, Any]:
    """The design we did not keep: cached prompts stay live as other sequences of
    one context and a hit copies the prefix with ``llama_memory_seq_cp`` (no
    data moves). Cold runs with the earlier prompt resident, as it would be."""
    import llama_cpp as ll

    from ..engines.llama_runtime import LlamaRuntime, SamplerSpec

    WORK_SEQ, SCRATCH_SEQ = 0, 1  # noqa: N806
    rt = LlamaRuntime(
        model_path, n_ctx=context_size, n_batch=batch_size, n_gpu_layers=0, n_threads=threads, flash_attn=flash_attn,
        n_seq=2, kv_unified=True,
    )

    def greedy(prompt: list[int], start: int) -> tuple[float, list[int], bytes]:
        sampler = rt.new_sampler(SamplerSpec(0.0, 0, 1.0, None))
        try:
            t0 = time.perf_counter()
            index = rt.prefill(prompt[start:], start)
            token = rt.sample(sampler, index)
            ttft = time.perf_counter() - t0
            logits = rt.logits(index)
            out = [token]
            for i in range(decode_tokens - 1):
                token = rt.sample(sampler, rt.prefill([token], len(prompt) + i))
                out.append(token)
            return ttft, out, logits
        finally:
            rt.free_sampler(sampler)

    rows = []
    try:
        for prompt, earlier in pairs:
            rt.clear()
            rt.prefill(earlier, 0, seq=SCRATCH_SEQ)  # the cache holds the earlier prompt
            cold_s, cold_out, cold_logits = greedy(prompt, 0)
            ll.llama_memory_seq_rm(rt.mem, WORK_SEQ, -1, -1)
            ll.llama_memory_seq_cp(rt.mem, SCRATCH_SEQ, WORK_SEQ, 0, prefix_tokens)
            warm_s, warm_out, warm_logits = greedy(prompt, prefix_tokens)
            rows.append((cold_s, warm_s, cold_out == warm_out, cold_logits == warm_logits))
    finally:
        rt.close()
    return {
        "method": "cached prompts as live sequences of one context, llama_memory_seq_cp on a hit",
        "cold_ttft_ms": round(median([r[0] for r in rows]) * 1000, 2),
        "warm_ttft_ms": round(median([r[1] for r in rows]) * 1000, 2),
        "warm_over_cold": round(median([r[1] / r[0] for r in rows]), 4),
        "greedy_identical": [r[2] for r in rows],
        "first_logits_bit_identical": [r[3] for r in rows],
    }


SWEEP_CONFIGS = ((False, 128), (False, 512), (True, 32), (True, 512))
"""(flash attention, prefill batch) pairs compared by ``--sweep``."""


def config_sweep(
    model_path: str,
    tokens: list[int],
    cut: int,
    *,
    threads: int,
    context_size: int,
    reps: int,
    decode_tokens: int,
) -> list[dict[str, Any]]:
    """Prefill and decode speed of each configuration, interleaved rep by rep,
    and whether cutting the prompt at ``cut`` (where a cache hit would end)
    changes the last token's logits by even one bit."""
    from ..engines.llama_runtime import LlamaRuntime, SamplerSpec

    rts = {
        cfg: LlamaRuntime(
            model_path, n_ctx=context_size, n_batch=cfg[1], n_gpu_layers=0, n_threads=threads, flash_attn=cfg[0]
        )
        for cfg in SWEEP_CONFIGS
    }
    timing: dict[tuple[bool, int], list[tuple[float, float]]] = {cfg: [] for cfg in SWEEP_CONFIGS}
    invariant: dict[tuple[bool, int], bool] = {}
    try:
        for rep in range(reps):
            for cfg, rt in rts.items():
                rt.clear()
                t0 = time.perf_counter()
                index = rt.prefill(tokens, 0)
                t1 = time.perf_counter()
                whole = rt.logits(index)
                sampler = rt.new_sampler(SamplerSpec(0.0, 0, 1.0, None))
                token = rt.sample(sampler, index)
                t2 = time.perf_counter()
                for i in range(decode_tokens):
                    token = rt.sample(sampler, rt.prefill([token], len(tokens) + i))
                t3 = time.perf_counter()
                rt.free_sampler(sampler)
                timing[cfg].append(((t1 - t0) * 1000 / len(tokens), (t3 - t2) * 1000 / decode_tokens))
                if rep == 0:
                    rt.clear()
                    rt.prefill(tokens[:cut], 0)
                    invariant[cfg] = rt.logits(rt.prefill(tokens[cut:], cut)) == whole
    finally:
        for rt in rts.values():
            rt.close()
    return [
        {
            "flash_attn": "on" if cfg[0] else "off",
            "batch_size": cfg[1],
            "prefill_ms_per_token": round(median([t[0] for t in timing[cfg]]), 3),
            "decode_ms_per_token": round(median([t[1] for t in timing[cfg]]), 3),
            "cut_at_cache_hit_bit_identical": invariant[cfg],
        }
        for cfg in SWEEP_CONFIGS
    ]


def llm_state_size(state: Any) -> int:
    return int(getattr(state, "llama_state_size", 0))
