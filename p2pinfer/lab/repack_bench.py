"""``p2pinfer bench cpu-repack``: what turning llama.cpp's CPU weight repacking off costs.

p2pinfer loads models with ``use_extra_bufts = False`` by default because
the AMX variant of llama.cpp's repacking crashes on some Intel CPUs (issue
13). Where repacking works, it may make matrix products faster; this
measures prefill and decode milliseconds per token with the setting off and
on, in the same run, alternating the two so that machine noise hits both.
Only tensors whose type has a repacked layout for this CPU are repacked
(llama.cpp says which when loading): the report counts them per model.
"""

from __future__ import annotations

import ctypes
import statistics
import time
from typing import Any

__all__ = ["run_repack_bench"]


def _repacked_tensors(model_path: str, cpu_repack: bool) -> tuple[int, float]:
    """(tensors llama.cpp repacked, MiB in CPU_REPACK buffers) when loading ``model_path``."""
    import llama_cpp as ll

    from ..engines.llama_runtime import _init_backend, _log_callback, model_params

    _init_backend()
    lines: list[str] = []

    @ll.llama_log_callback
    def capture(level: int, text: bytes, _user: Any) -> None:
        lines.append(text.decode("utf-8", "replace"))

    ll.llama_log_set(capture, ctypes.c_void_p(0))
    try:
        model = ll.llama_model_load_from_file(model_path.encode(), model_params(0, cpu_repack=cpu_repack))
        ll.llama_model_free(model)
    finally:
        ll.llama_log_set(_log_callback, ctypes.c_void_p(0))
    count = sum(1 for ln in lines if ln.startswith("repack: repack tensor"))
    mib = 0.0
    for ln in lines:
        if "CPU_REPACK model buffer size" in ln:
            mib += float(ln.split("=")[1].split()[0])
    return count, mib


def _one_round(model_path: str, cpu_repack: bool, prompt: list[int], decode: int, threads: int) -> tuple[float, float]:
    """(prefill ms per token, decode ms per token) of one fresh load."""
    from ..engines.llama_runtime import LlamaRuntime, SamplerSpec

    rt = LlamaRuntime(model_path, n_ctx=len(prompt) + decode + 16, n_batch=128, n_gpu_layers=0,
                      n_threads=threads, flash_attn=False, cpu_repack=cpu_repack)
    try:
        sampler = rt.new_sampler(SamplerSpec(0.0, 0, 1.0, None))
        rt.prefill(prompt[:32], 0)  # warm the weights into the caches
        rt.clear()
        t0 = time.perf_counter()
        index = rt.prefill(prompt, 0)
        prefill_s = time.perf_counter() - t0
        token = rt.sample(sampler, index)
        t1 = time.perf_counter()
        for i in range(decode):
            token = rt.sample(sampler, rt.prefill([token], len(prompt) + i))
        decode_s = time.perf_counter() - t1
        rt.free_sampler(sampler)
    finally:
        rt.close()
    return prefill_s * 1000 / len(prompt), decode_s * 1000 / decode


def run_repack_bench(models: list[tuple[str, str]], *, rounds: int, prompt_tokens: int, decode_tokens: int,
                     threads: int) -> dict[str, Any]:
    """``models`` are (label, GGUF path); returns one JSON-ready object."""
    from .engine_bench import bench_texts
    from ..engines.llama_runtime import LlamaRuntime

    text = next(iter(bench_texts()))[0]
    out: list[dict[str, Any]] = []
    for label, path in models:
        probe = LlamaRuntime(path, n_ctx=64, n_batch=32, n_gpu_layers=0, n_threads=threads)
        try:
            tokens = probe.tokenize(text * 4, add_special=True)[:prompt_tokens]
        finally:
            probe.close()
        runs: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for r in range(rounds):
            for setting in ((False, True) if r % 2 == 0 else (True, False)):
                runs[setting].append(_one_round(path, setting, tokens, decode_tokens, threads))
        row: dict[str, Any] = {"model": label, "path": path, "prompt_tokens": len(tokens), "decode_tokens": decode_tokens}
        for setting, name in ((False, "repack_off"), (True, "repack_on")):
            pre = [p for p, _ in runs[setting]]
            dec = [d for _, d in runs[setting]]
            count, mib = _repacked_tensors(path, setting)
            row[name] = {
                "prefill_ms_per_token": round(statistics.median(pre), 3),
                "prefill_ms_per_token_range": [round(min(pre), 3), round(max(pre), 3)],
                "decode_ms_per_token": round(statistics.median(dec), 3),
                "decode_ms_per_token_range": [round(min(dec), 3), round(max(dec), 3)],
                "tensors_repacked": count,
                "repack_buffer_mib": mib,
            }
        row["off_over_on_prefill"] = round(row["repack_off"]["prefill_ms_per_token"] / row["repack_on"]["prefill_ms_per_token"], 3)
        row["off_over_on_decode"] = round(row["repack_off"]["decode_ms_per_token"] / row["repack_on"]["decode_ms_per_token"], 3)
        out.append(row)
    return {"benchmark": "cpu-repack", "rounds": rounds, "threads": threads, "models": out}
