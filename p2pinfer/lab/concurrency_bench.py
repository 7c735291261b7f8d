"""``p2pinfer bench concurrency``: many requests at once on one node, against llama-server.

Two parts, measured in the same run on the same prompts:

* **single stream, engine against raw llama.cpp**: the llama-cpp engine
  (``generate``, cache emptied before each prompt) and llama-cpp-python's
  own ``Llama`` (``Llama.generate``, loaded by
  :func:`~p2pinfer.engines.llama_runtime.plain_llama` with the same
  ``use_extra_bufts`` choice, in a child process of its own: see
  ``_RawLlamaProcess``), alternating prompt by prompt. Prefill is the
  time to the first token over the prompt's tokens; decode the time from
  the first to the last token over the tokens in between.
* **N requests in flight through the HTTP API**: one ``p2pinfer node``
  process, and a ``llama-server`` process when its binary is given, both
  started with the same threads and per-request context. N client threads
  each send ``requests_per_client`` streaming chat completions one after
  the other with the official ``openai`` client (two waves of N by
  default). Every request has its own prompt (about 300 tokens of MMLU
  questions through the model's chat template, no two sharing their
  content), so what is measured is batching and prefill, not the cache.
  ``tokens_per_s`` is the answers' tokens over the level's wall time;
  TTFT is from sending a request to its first content chunk.

Rounds alternate which server goes first at each level; figures are
medians over rounds with [min, max].
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
import os
from pathlib import Path
import shutil
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from typing import Any

from ..stats import percentile, rounded

__all__ = ["ServerUnderTest", "build_prompts", "run_concurrency_bench"]

SYSTEM = "You are a patient teacher. Answer every question in full sentences and explain your reasoning."


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    messages: tuple[dict[str, str], ...]
    tokens: tuple[int, ...]
    """The prompt as the model's chat template renders it (for the single-stream part)."""


def build_prompts(engine: Any, count: int, target_tokens: int = 300) -> list[ChatPrompt]:
    """``count`` chat prompts of about ``target_tokens`` tokens, each from its own MMLU questions."""
    from ..workloads.mmlu import format_question, load_mmlu

    subjects = None
    for source in (None, "/work/shared/data/mmlu"):
        try:
            subjects = load_mmlu(source)
            break
        except (OSError, ValueError):
            continue
    if not subjects:
        raise RuntimeError("no MMLU questions found (packaged subset or /work/shared/data/mmlu)")
    questions = [q for s in subjects for q in s.test]
    frame = len(engine.chat_tokens([{"role": "system", "content": SYSTEM}, {"role": "user", "content": "x"}]))
    budget = max(16, target_tokens - frame)
    out: list[ChatPrompt] = []
    seen_starts: set[tuple[int, ...]] = set()
    i = 0
    while len(out) < count:
        if i >= len(questions):
            raise RuntimeError(f"only {len(out)} distinct prompts could be built from MMLU")
        text = ""
        while len(engine.tokenize(text, add_special=False)) < budget and i < len(questions):
            text += format_question(questions[i], with_answer=False) + "\n\n"
            i += 1
        body = engine.detokenize(engine.tokenize(text, add_special=False)[: budget - 12]).strip()
        content = body + "\n\nFor each question, say which answer is right and explain why in detail."
        messages = ({"role": "system", "content": SYSTEM}, {"role": "user", "content": content})
        tokens = tuple(engine.chat_tokens(list(messages)))
        start = tokens[frame - 8 : frame + 8]
        if start in seen_starts:
            continue
        seen_starts.add(start)
        out.append(ChatPrompt(messages, tokens))
    return out


def _median_range(xs: Sequence[float], digits: int = 3) -> tuple[float, list[float]]:
    return round(statistics.median(xs), digits), [round(min(xs), digits), round(max(xs), digits)]


# -- part 1: one stream, engine against llama-cpp-python's Llama -------------------
def _per_token_ms(stamps: list[float], t0: float, n_prompt: int) -> tuple[float, float]:
    """(prefill ms per prompt token, decode ms per token) from a stream's token times."""
    return ((stamps[0] - t0) * 1000 / n_prompt, (stamps[-1] - stamps[0]) * 1000 / (len(stamps) - 1))


def _raw_llama_worker(conn: Any, model_path: str, context_size: int, threads: int, max_tokens: int) -> None:
    """Child process: llama-cpp-python's ``Llama`` timing one prompt per message."""
    import llama_cpp

    from ..engines.llama_runtime import plain_llama

    llm = plain_llama(model_path, n_ctx=context_size, n_threads=threads, n_threads_batch=threads, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    conn.send("ready")
    while (tokens := conn.recv()) is not None:
        llm.reset()
        llm._ctx.kv_cache_clear()
        stamps: list[float] = []
        t0 = time.perf_counter()
        for tok in llm.generate(tokens, temp=0.0, reset=True):
            if llama_cpp.llama_vocab_is_eog(vocab, tok):
                break
            stamps.append(time.perf_counter())
            if len(stamps) >= max_tokens:
                break
        conn.send(_per_token_ms(stamps, t0, len(tokens)))
    llm.close()


class _RawLlamaProcess:
    """``Llama`` in its own process, so that its llama.cpp threads and the engine's never share one
    OpenMP runtime: with two threads of one process each running llama.cpp graphs, libgomp counts
    more threads than cores and shortens its barrier spinning, and decode slowed from about 12 to
    20-30 ms per token for both on 2 cores (measured; docs/results.md, issue 18)."""

    def __init__(self, model_path: str, *, context_size: int, threads: int, max_tokens: int) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_raw_llama_worker, args=(child, model_path, context_size, threads, max_tokens),
                                 daemon=True)
        self._proc.start()
        child.close()
        if self._conn.recv() != "ready":
            raise RuntimeError("the raw Llama process did not start")

    def run(self, tokens: list[int]) -> tuple[float, float]:
        self._conn.send(list(tokens))
        prefill, decode = self._conn.recv()
        return float(prefill), float(decode)

    def close(self) -> None:
        try:
            self._conn.send(None)
        except OSError:
            pass
        self._proc.join(30)
        if self._proc.is_alive():
            self._proc.kill()


def single_stream(
    model_path: str, prompts: Sequence[ChatPrompt], *, threads: int, context_size: int, slots: int | None,
    max_tokens: int, reps: int,
) -> dict[str, Any]:
    import trio

    from ..engines import GenerationParams, GenerationRecord
    from ..engines.llama_cpp import LlamaCppEngine

    engine = LlamaCppEngine(model_path, context_size=context_size, threads=threads, slots=slots)
    raw = _RawLlamaProcess(model_path, context_size=context_size, threads=threads, max_tokens=max_tokens)
    rows: dict[str, list[tuple[float, float]]] = {"engine": [], "raw_llama_cpp": []}

    async def on_engine(tokens: list[int]) -> tuple[float, float]:
        engine.cache.clear()
        stamps: list[float] = []
        t0 = time.perf_counter()
        async for item in engine.generate(tokens, GenerationParams(max_tokens=max_tokens)):
            if not isinstance(item, GenerationRecord):
                stamps.append(time.perf_counter())
        await engine.wait_reply_saves()  # untimed, and done before Llama's turn on the same cores
        return _per_token_ms(stamps, t0, len(tokens))

    def on_raw(tokens: list[int]) -> tuple[float, float]:
        return raw.run(tokens)

    try:
        for rep in range(reps):
            for i, prompt in enumerate(prompts):
                tokens = list(prompt.tokens)
                first_engine = (rep + i) % 2 == 0
                for which in ("engine", "raw") if first_engine else ("raw", "engine"):
                    if which == "engine":
                        rows["engine"].append(trio.run(on_engine, tokens))
                    else:
                        rows["raw_llama_cpp"].append(on_raw(tokens))
    finally:
        raw.close()
        trio.run(engine.aclose)
    out: dict[str, Any] = {}
    for name, values in rows.items():
        pre, pre_range = _median_range([p for p, _ in values])
        dec, dec_range = _median_range([d for _, d in values])
        out[name] = {
            "prefill_ms_per_token": pre, "prefill_ms_per_token_range": pre_range,
            "decode_ms_per_token": dec, "decode_ms_per_token_range": dec_range, "runs": len(values),
        }
    e, r = out["engine"], out["raw_llama_cpp"]
    out["engine_over_raw"] = {
        "prefill": round(e["prefill_ms_per_token"] / r["prefill_ms_per_token"], 3),
        "decode": round(e["decode_ms_per_token"] / r["decode_ms_per_token"], 3),
    }
    return out


# -- part 2: N in flight through HTTP --------------------------------------------------
class ServerUnderTest:
    """An OpenAI-compatible server process: ``base_url``, ``stop()``."""

    name = "server"

    def __init__(self) -> None:
        self.base_url = ""
        self.extra_body: dict[str, Any] = {}

    def stop(self) -> None: ...

    def settle(self) -> None:
        """Until work the server does after its answers (none here) is done, so that it does
        not run beside the other server's level."""


class P2pinferNode(ServerUnderTest):
    name = "p2pinfer"

    def __init__(self, model_path: str, *, threads: int, context_size: int, slots: int | None,
                 reply_cache: bool = True, flash_attn: str = "auto") -> None:
        super().__init__()
        from .local_swarm import LocalSwarm

        args = ["--model", model_path, "--threads", str(threads), "--context-size", str(context_size)]
        if slots:
            args += ["--slots", str(slots)]
        if not reply_cache:
            args.append("--no-reply-cache")
        if flash_attn != "auto":
            args += ["--flash-attn", flash_attn]
        self._swarm = LocalSwarm(1, engine="llama-cpp", node_args=args).start()
        self.base_url = self._swarm.nodes[0].http.rstrip("/") + "/v1"

    def stop(self) -> None:
        self._swarm.stop()

    def settle(self, timeout_s: float = 120.0) -> None:
        """Until the node saves no reply (it saves the last answers' after their streams ended)."""
        self._swarm.nodes[0].wait_reply_saves(timeout_s)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LlamaServer(ServerUnderTest):
    """llama.cpp's own server: ``-np slots``, weight repacking off like p2pinfer, the rest its defaults."""

    name = "llama-server"

    def __init__(self, binary: str, model_path: str, *, threads: int, context_size: int, slots: int,
                 start_timeout_s: float = 120.0, extra_args: Sequence[str] = ()) -> None:
        super().__init__()
        import httpx

        port = _free_port()
        self.command = [
            binary, "-m", model_path, "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
            "-tb", str(threads), "-np", str(slots), "-c", str(context_size * slots), "--no-repack", "--no-webui", *extra_args,
        ]
        self._log = tempfile.NamedTemporaryFile(prefix="llama-server-", suffix=".log", delete=False)
        self.log_path = self._log.name
        self._proc = subprocess.Popen(self.command, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        self.base_url = f"http://127.0.0.1:{port}/v1"
        self.extra_body = {"stream_options": {"include_usage": True}}
        deadline = time.monotonic() + start_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self._proc.returncode}: {self.log_tail()}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"llama-server not ready after {start_timeout_s:.0f} s: {self.log_tail()}")

    def log_tail(self, chars: int = 2000) -> str:
        return Path(self.log_path).read_text(errors="replace")[-chars:]

    def settings(self) -> dict[str, Any]:
        """What the server says it runs with (from its log)."""
        text = Path(self.log_path).read_text(errors="replace")
        keep = [ln.strip() for ln in text.splitlines() if any(k in ln for k in ("flash_attn", "n_ctx_seq", "n_slots", "n_batch", "n_ubatch", "kv_unified", "system_info"))]
        return {"command": self.command[1:], "log_lines": keep[:12]}

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(15)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._log.close()


@dataclass(slots=True)
class _Result:
    start: float
    first: float | None
    end: float
    tokens: int
    error: str | None = None


def _one_request(client: Any, prompt: ChatPrompt, max_tokens: int, extra_body: dict[str, Any]) -> _Result:
    t0 = time.perf_counter()
    first = None
    chunks = 0
    usage = None
    try:
        stream = client.chat.completions.create(
            model="default", messages=list(prompt.messages), max_tokens=max_tokens, temperature=0.0, stream=True,
            extra_body=extra_body or None,
        )
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage.completion_tokens
            if chunk.choices and chunk.choices[0].delta.content:
                if first is None:
                    first = time.perf_counter()
                chunks += 1
    except Exception as exc:  # noqa: BLE001 - reported in the JSON, the run goes on
        return _Result(t0, first, time.perf_counter(), 0, f"{type(exc).__name__}: {exc}")
    return _Result(t0, first, time.perf_counter(), usage if usage is not None else chunks)


def run_level(server: ServerUnderTest, prompts: Sequence[ChatPrompt], concurrency: int, requests_per_client: int,
              max_tokens: int) -> dict[str, Any]:
    """``concurrency`` client threads, each sending its share of ``prompts`` one after the other."""
    import openai

    if len(prompts) < concurrency * requests_per_client:
        raise ValueError("not enough prompts for this level")
    client = openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0, timeout=900.0)
    results: list[_Result] = []
    lock = threading.Lock()

    def worker(k: int) -> None:
        for j in range(requests_per_client):
            r = _one_request(client, prompts[k * requests_per_client + j], max_tokens, server.extra_body)
            with lock:
                results.append(r)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ok = [r for r in results if r.error is None and r.first is not None]
    wall = max(r.end for r in results) - min(r.start for r in results)
    ttft = sorted((r.first - r.start) * 1000 for r in ok)  # type: ignore[operator]
    return {
        "concurrency": concurrency,
        "requests": len(results),
        "errors": [r.error for r in results if r.error is not None],
        "tokens": sum(r.tokens for r in ok),
        "wall_s": round(wall, 3),
        "tokens_per_s": round(sum(r.tokens for r in ok) / wall, 3) if wall > 0 else 0.0,
        "ttft_ms_p50": rounded(percentile(ttft, 50, method="linear"), 1),  # numpy's default, as published
        "ttft_ms_p99": rounded(percentile(ttft, 99, method="linear"), 1),
    }


def _summarise(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"concurrency": rounds[0]["concurrency"], "rounds": len(rounds)}
    for key in ("tokens_per_s", "ttft_ms_p50", "ttft_ms_p99"):
        values = [r[key] for r in rounds if r[key] is not None]
        if values:
            out[key], out[f"{key}_range"] = _median_range(values, 1 if key != "tokens_per_s" else 3)
    out["errors"] = sum(len(r["errors"]) for r in rounds)
    out["runs"] = rounds
    return out


def run_concurrency_bench(
    *,
    levels: Sequence[int],
    model_path: str | None = None,
    threads: int | None = None,
    slots: int | None = None,
    context_size: int = 4096,
    prompt_tokens: int = 300,
    max_tokens: int = 64,
    requests_per_client: int = 2,
    rounds: int = 3,
    reply_cache: bool = True,
    flash_attn: str = "auto",
    single_stream_prompts: int = 4,
    single_stream_reps: int = 2,
    llama_server: str | None = None,
    llama_server_slots: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """See the module docstring; returns one JSON-ready object."""
    from ..engines.llama_cpp import LlamaCppEngine, default_slots
    from ..engines.model_files import resolve_model_path

    say = progress or (lambda _msg: None)
    path = str(resolve_model_path(model_path))
    threads = threads or os.cpu_count() or 1
    if llama_server and not (Path(llama_server).exists() or shutil.which(llama_server)):
        raise FileNotFoundError(f"no llama-server binary at {llama_server}")
    per_round = sum(n * requests_per_client for n in levels)
    tokenizer = LlamaCppEngine(path, context_size=512, slots=1, threads=1, cache_tokens=0)
    try:
        prompts = build_prompts(tokenizer, per_round * rounds + single_stream_prompts + 2, prompt_tokens)
    finally:
        import trio

        trio.run(tokenizer.aclose)
    warmup, single, pool = prompts[:2], prompts[2 : 2 + single_stream_prompts], prompts[2 + single_stream_prompts :]
    engine_slots = slots or default_slots(0, threads)
    server_slots = llama_server_slots or max(levels)
    result: dict[str, Any] = {
        "benchmark": "concurrency",
        "model": path,
        "threads": threads,
        "context_size": context_size,
        "prompt_tokens_median": int(statistics.median(len(p.tokens) for p in prompts)),
        "max_tokens": max_tokens,
        "requests_per_client": requests_per_client,
        "slots": engine_slots,
        "reply_cache": reply_cache,
        "flash_attn": flash_attn,
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    say("single stream: engine against Llama")
    result.update(
        single_stream(path, single, threads=threads, context_size=context_size, slots=slots, max_tokens=max_tokens,
                      reps=single_stream_reps)
    )
    servers: list[ServerUnderTest] = []
    try:
        say("starting the p2pinfer node")
        servers.append(P2pinferNode(path, threads=threads, context_size=context_size, slots=slots, reply_cache=reply_cache,
                                     flash_attn=flash_attn))
        if llama_server:
            say("starting llama-server")
            ls = LlamaServer(llama_server, path, threads=threads, context_size=context_size, slots=server_slots)
            servers.append(ls)
        import openai

        for server in servers:  # untimed requests first: pages in, graphs built
            client = openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0, timeout=900.0)
            for p in warmup:
                _one_request(client, p, 8, server.extra_body)
            server.settle()
        runs: dict[str, dict[int, list[dict[str, Any]]]] = {s.name: {n: [] for n in levels} for s in servers}
        offset = 0
        for r in range(rounds):
            for n in levels:
                share = pool[offset : offset + n * requests_per_client]
                offset += n * requests_per_client
                order = servers if r % 2 == 0 else list(reversed(servers))
                for server in order:
                    say(f"round {r + 1}/{rounds}: {n} in flight on {server.name}")
                    runs[server.name][n].append(run_level(server, share, n, requests_per_client, max_tokens))
                    server.settle()
        result["levels"] = [_summarise(runs["p2pinfer"][n]) for n in levels]
        if llama_server:
            result["llama_server"] = {
                "binary": llama_server, "slots": server_slots, **ls.settings(),
                "levels": [_summarise(runs["llama-server"][n]) for n in levels],
            }
            result["p2pinfer_over_llama_server"] = [
                {
                    "concurrency": a["concurrency"],
                    "tokens_per_s": round(a["tokens_per_s"] / b["tokens_per_s"], 3),
                    "ttft_ms_p50": round(a["ttft_ms_p50"] / b["ttft_ms_p50"], 3),
                }
                for a, b in zip(result["levels"], result["llama_server"]["levels"])
            ]
    finally:
        for server in servers:
            server.stop()
    result["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return result
