"""A thin synchronous layer over llama.cpp's C API (through llama-cpp-python).

We do not use ``llama_cpp.Llama``: it owns a single-sequence context and
reuses only the prefix of the tokens it evaluated last. A
:class:`LlamaRuntime` is one context with ``n_seq`` sequences, one per
slot of the engine's continuous batching, and **one KV stream per
sequence** (``kv_unified = false``): each sequence's cells are its own, at
indices ``0..n-1`` of its stream, and attention reads only them. That is
what makes a sequence's logits the same whatever its neighbours in a batch
(see :meth:`LlamaRuntime.decode` and docs/architecture.md, "exactness").

Facts of llama.cpp (0.3.36's vendored copy) this module is built on, each
checked by a test in tests/engines/test_llama_runtime.py:

* the prompt chunk of one sequence and the decode tokens of others cannot
  share one ``llama_decode`` usefully: with per-sequence streams llama.cpp
  splits a batch with ``split_equal``, which puts the same number of tokens
  of every sequence in a micro-batch, and takes sequences in consecutive
  id order only. So the engine evaluates a prompt chunk alone, and a decode
  step for consecutive slots is one micro-batch;
* a state blob (``llama_state_seq_get_data``) carries the context's stream
  count, and loading one *replaces* the sequence; saved spans are therefore
  kept in :mod:`~p2pinfer.engines.kv_state`'s form and a restore writes one
  blob for the whole cached prefix;
* llama.cpp's CPU matrix products take other kernels for a one-row
  right-hand side than for two or more (llamafile's sgemm starts at two
  rows); for this model's types both give the same bits, which the
  batch-invariance test checks.

Every method that touches the context must run in one thread at a time
(the engine's slot loop owns it); the vocabulary methods only read and may
run anywhere.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass
import logging
import os
import threading
import time
from typing import Any, TypeVar

import blake3
import llama_cpp as _ll

from ..core.costmodel import chunk_cuts
from .base import TokenLogprob
from .kv_state import KvFormatError, KvLayout, KvSpan, KvWindowError, encode, parse

__all__ = [
    "CPU_REPACK_UPSTREAM_ISSUE",
    "DecodeError",
    "JobCancelled",
    "LlamaRuntime",
    "RestoreError",
    "GrammarError",
    "SamplerSpec",
    "model_params",
    "plain_llama",
]

log = logging.getLogger("p2pinfer.llama")

_ALL_LAYERS = 0x7FFFFFFF

_LEVELS = {3: logging.WARNING, 4: logging.ERROR}
"""ggml_log_level: 1 debug, 2 info, 3 warn, 4 error, 5 continuation."""


@_ll.llama_log_callback
def _log_callback(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    # llama.cpp prints hundreds of lines per model load on its own stderr;
    # keep warnings and errors, in Python's logging where they belong.
    py_level = _LEVELS.get(level)
    if py_level is not None and log.isEnabledFor(py_level):
        log.log(py_level, "%s", text.decode("utf-8", "replace").rstrip())


_backend_lock = threading.Lock()
_backend_ready = False


def _init_backend() -> None:
    global _backend_ready
    with _backend_lock:
        if not _backend_ready:
            _ll.llama_log_set(_log_callback, ctypes.c_void_p(0))
            _ll.llama_backend_init()
            _backend_ready = True


CPU_REPACK_UPSTREAM_ISSUE = "https://github.com/ggml-org/llama.cpp/issues/20824"
"""Why CPU weight repacking is off by default: on Intel AMX CPUs (Sapphire Rapids
and later) llama.cpp's AMX buffer type crashes in ``ggml_backend_amx_mul_mat``."""


def model_params(n_gpu_layers: int, *, cpu_repack: bool = False) -> Any:
    """llama.cpp model parameters as every p2pinfer engine loads a model.

    ``cpu_repack=False`` sets ``use_extra_bufts = False``: no extra CPU
    buffer types (the AMX, repacked AVX/NEON and KleidiAI weight layouts).
    llama.cpp turns them on by default, and on AMX CPUs that path segfaults
    (:data:`CPU_REPACK_UPSTREAM_ISSUE`, closed without a fix), so a node must
    opt in. What it costs where repacking works is in docs/results.md.
    """
    mparams = _ll.llama_model_default_params()
    mparams.n_gpu_layers = _ALL_LAYERS if n_gpu_layers < 0 else n_gpu_layers
    mparams.use_extra_bufts = bool(cpu_repack)
    return mparams


_plain_lock = threading.Lock()


def plain_llama(model_path: str, *, cpu_repack: bool = False, **kwargs: Any) -> Any:
    """llama-cpp-python's own ``Llama`` (the baseline benchmarks compare with),
    loaded with the same ``use_extra_bufts`` choice as our engine.

    ``Llama`` has no parameter for it, so its call to
    ``llama_model_default_params`` is redirected while it loads.
    """
    import llama_cpp.llama_cpp as low  # noqa: PLC0415 - the module Llama reads its defaults from

    original = low.llama_model_default_params

    def defaults() -> Any:
        mparams = original()
        mparams.use_extra_bufts = bool(cpu_repack)
        return mparams

    with _plain_lock:
        low.llama_model_default_params = defaults
        try:
            return _ll.Llama(model_path, **kwargs)
        finally:
            low.llama_model_default_params = original


T = TypeVar("T")


def on_passing_thread(fn: Callable[[], T]) -> T:
    """``fn()`` on a thread of its own that ends with it.

    Why: llama-cpp-python's CPU build runs graphs with OpenMP, and libgomp
    keeps a pool of worker threads for every thread that ever ran a graph,
    for as long as that thread lives. With two such threads in one process
    (the constructor's, say the main thread, and the engine's slot loop)
    libgomp counts more threads than cores and cuts its barrier spinning to
    almost nothing, so every barrier of every later graph sleeps: decode of
    SmolLM2 on 2 cores went from about 12 to about 22 ms per token
    (docs/results.md, issue 18). A thread that ends frees its pool, so
    llama.cpp work outside the slot loop runs here.
    """
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=run, name="p2pinfer-llama-once")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


class DecodeError(RuntimeError):
    """llama_decode failed; the working sequence is in an unknown state."""


class RestoreError(RuntimeError):
    """A saved span could not be put back; the caller recomputes instead."""


class JobCancelled(Exception):
    """The request was cancelled between two batches."""


PENALTY_LAST_N = 64
"""Penalties look at this many of the latest tokens (llama.cpp's default)."""


class GrammarError(ValueError):
    """llama.cpp could not parse a GBNF grammar."""


@dataclass(frozen=True, slots=True)
class SamplerSpec:
    """Everything that decides how one request picks its tokens, in one place.

    The engine builds it from the request's ``GenerationParams``; the slot
    loop reads it once per slot at admission and :meth:`LlamaRuntime.new_sampler`
    turns it into that request's own llama.cpp sampler chain. New per-request
    sampling features (grammar, repetition penalties, logit bias) belong here
    and in ``new_sampler``; whatever reads the logits (logprobs) reads the
    request's own row, ``LlamaRuntime.logits(index)``, in the loop.
    """

    temperature: float
    top_k: int
    top_p: float
    seed: int | None
    grammar: str | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: bool = False
    """Read each sampled token's log-probability (:meth:`LlamaRuntime.token_logprob`)."""
    top_logprobs: int = 0

    @classmethod
    def of(cls, params: Any) -> SamplerSpec:
        """From a request's :class:`~p2pinfer.engines.base.GenerationParams`."""
        return cls(
            params.temperature, params.top_k, params.top_p, params.seed, params.grammar,
            params.presence_penalty, params.frequency_penalty, params.repetition_penalty,
            params.logprobs, params.top_logprobs,
        )


class LlamaRuntime:
    """One model and one context of ``n_seq`` sequences, each ``n_ctx`` tokens long."""

    def __init__(
        self,
        model_path: str,
        *,
        n_ctx: int,
        n_batch: int,
        n_gpu_layers: int,
        n_threads: int,
        flash_attn: bool | None = None,
        cpu_repack: bool = False,
        n_seq: int = 1,
        kv_unified: bool = False,
    ) -> None:
        """``n_ctx`` is per sequence: the context holds ``n_seq * n_ctx`` cells.

        ``kv_unified=True`` puts every sequence in one cell pool (only the
        rejected live-sequences experiment of ``bench engine`` uses it).
        """
        if not 1 <= n_seq <= 256:
            raise ValueError("n_seq must be in 1..256")
        _init_backend()
        mparams = model_params(n_gpu_layers, cpu_repack=cpu_repack)
        self.cpu_repack = bool(cpu_repack)
        t0 = time.perf_counter()
        model = _ll.llama_model_load_from_file(model_path.encode(), mparams)
        if not model:
            raise ValueError(f"llama.cpp could not load {model_path} (not a GGUF model file?)")
        self.model = model
        self.vocab = _ll.llama_model_get_vocab(model)
        cparams = _ll.llama_context_default_params()
        cparams.n_ctx = n_ctx * (1 if kv_unified else n_seq)
        cparams.n_batch = cparams.n_ubatch = max(min(n_batch, n_ctx), n_seq)
        cparams.n_seq_max = n_seq
        cparams.kv_unified = kv_unified
        # llama.cpp's default, made explicit: a sliding-window cache as long as
        # the full one, so every position sits in the cell of its index in both
        # (a ring of the window would place positions by history; see cache_window)
        cparams.swa_full = True
        cparams.n_threads = cparams.n_threads_batch = n_threads
        cparams.no_perf = True
        if flash_attn is not None:
            cparams.flash_attn_type = (
                _ll.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else _ll.LLAMA_FLASH_ATTN_TYPE_DISABLED
            )
        ctx = _ll.llama_init_from_model(model, cparams)
        if not ctx:
            _ll.llama_model_free(model)
            raise ValueError(f"llama.cpp could not create a context of {n_seq} x {n_ctx} tokens")
        self.ctx = ctx
        self.mem = _ll.llama_get_memory(ctx)
        self.n_seq = n_seq
        self.kv_unified = kv_unified
        self.n_ctx = int(_ll.llama_n_ctx_seq(ctx))
        """Cells per sequence (llama.cpp may round the request up)."""
        self.n_batch = int(cparams.n_batch)
        self.n_vocab = int(_ll.llama_vocab_n_tokens(self.vocab))
        self.n_layer = int(_ll.llama_model_n_layer(model))
        self.n_gpu_layers = n_gpu_layers
        self.n_threads = n_threads
        self.flash_attn = flash_attn
        self.load_s = time.perf_counter() - t0
        self._batch = _ll.llama_batch_init(self.n_batch, 0, 1)
        self.batches_evaluated = 0
        """llama_decode calls so far (observability: shows where a cancel stopped)."""
        try:
            self.layout = on_passing_thread(self._probe_layout)
            """This context's KV layout (types and row sizes), read from a real blob."""
        except BaseException:
            self.close()
            raise
        self.cache_window: int | None = None
        """Longest sequence a span can be saved from, or None for no limit.

        A model with an interleaved sliding-window KV cache (two sections in
        its state blob: full-attention layers, then sliding-window layers)
        keeps only the last ``n_swa`` positions of the sliding-window layers,
        so a span of the whole sequence exists only while it is at most
        ``n_swa`` long (see :mod:`~p2pinfer.engines.kv_state`). With
        ``swa_full`` (set above) restoring such a span puts every position in
        the same cell as evaluating it would, in both sections, so a cache hit
        stays exact.
        """
        if len(self.layout.layers_per_section) > 1:
            self.cache_window = max(0, int(_ll.llama_model_n_swa(model)))

    # -- lifetime ----------------------------------------------------------
    def close(self) -> None:
        if self._batch is not None:
            _ll.llama_batch_free(self._batch)
            self._batch = None
        if self.ctx:
            _ll.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            _ll.llama_model_free(self.model)
            self.model = None

    # -- vocabulary (read-only, any thread) ---------------------------------
    def tokenize(self, text: str, *, add_special: bool, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 16
        buf = (_ll.llama_token * cap)()
        n = _ll.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (_ll.llama_token * cap)()
            n = _ll.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
            if n < 0:
                raise ValueError("llama.cpp could not tokenize the text")
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """The bytes a token stands for (special tokens render as nothing)."""
        buf = ctypes.create_string_buffer(64)
        n = _ll.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = _ll.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
        return buf.raw[:n]

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        return bool(_ll.llama_vocab_is_eog(self.vocab, token))

    def token_text(self, token: int) -> str:
        if token < 0:
            return ""
        raw = _ll.llama_vocab_get_text(self.vocab, token)
        return raw.decode("utf-8", "replace") if raw else ""

    @property
    def bos(self) -> int:
        return int(_ll.llama_vocab_bos(self.vocab))

    @property
    def eos(self) -> int:
        return int(_ll.llama_vocab_eos(self.vocab))

    def chat_template(self) -> str | None:
        raw = _ll.llama_model_chat_template(self.model, None)
        return raw.decode("utf-8") if raw else None

    def description(self) -> str:
        buf = ctypes.create_string_buffer(256)
        _ll.llama_model_desc(self.model, buf, len(buf))
        return buf.value.decode("utf-8", "replace")

    def vocab_digest(self) -> str:
        """Digest of every token's text, score and attributes plus the special ids.

        Two GGUF files with equal digests tokenize identically; about 0.1 s
        for a 50k vocabulary.
        """
        h = blake3.blake3()
        v = self.vocab
        header = [
            int(_ll.llama_vocab_type(v)),
            self.n_vocab,
            self.bos,
            self.eos,
            int(_ll.llama_vocab_eot(v)),
            int(_ll.llama_vocab_get_add_bos(v)),
            int(_ll.llama_vocab_get_add_eos(v)),
        ]
        h.update(repr(header).encode())
        get_text, get_score, get_attr = _ll.llama_vocab_get_text, _ll.llama_vocab_get_score, _ll.llama_vocab_get_attr
        parts: list[bytes] = []
        for t in range(self.n_vocab):
            parts.append(get_text(v, t) or b"")
            parts.append(b"\x00%r\x00%d\x01" % (get_score(v, t), get_attr(v, t)))
        h.update(b"".join(parts))
        return h.hexdigest()[:32]

    # -- context operations (one thread at a time) ---------------------------
    def clear(self) -> None:
        """Empty every sequence: the next tokens of each go to cells 0, 1, 2, ..."""
        _ll.llama_memory_clear(self.mem, True)

    def clear_seq(self, seq: int) -> None:
        """Empty one sequence (its stream's next cells are 0, 1, 2, ... again)."""
        _ll.llama_memory_seq_rm(self.mem, seq, -1, -1)

    def truncate_seq(self, seq: int, length: int) -> None:
        """Drop positions ``length...`` of ``seq`` (the next token goes at ``length``)."""
        if not _ll.llama_memory_seq_rm(self.mem, seq, length, -1):
            raise DecodeError(f"llama.cpp could not cut sequence {seq} at position {length}")

    def seq_len(self, seq: int = 0) -> int:
        return int(_ll.llama_memory_seq_pos_max(self.mem, seq)) + 1

    def work_len(self) -> int:
        return self.seq_len(0)

    def _decode(self, n: int, what: str) -> None:
        rc = _ll.llama_decode(self.ctx, self._batch)
        self.batches_evaluated += 1
        if rc != 0:
            raise DecodeError(f"llama_decode returned {rc} ({what}, {n} tokens)")

    def eval_chunk(self, tokens: Sequence[int], pos0: int, seq: int = 0, *, logits_from: int | None = None) -> int:
        """One ``llama_decode`` of ``tokens`` at positions ``pos0...`` of ``seq``,
        with logits for the last one only, or for rows ``logits_from...`` (an
        answer check reads them: :func:`~.llama_score.score_chunk`); returns
        the last row's index."""
        n = len(tokens)
        if not 0 < n <= self.n_batch:
            raise ValueError(f"a chunk holds 1..{self.n_batch} tokens, not {n}")
        batch = self._batch
        batch.n_tokens = n
        tok, pos, nseq, seqs, logits = batch.token, batch.pos, batch.n_seq_id, batch.seq_id, batch.logits
        for j in range(n):
            tok[j] = tokens[j]
            pos[j] = pos0 + j
            nseq[j] = 1
            seqs[j][0] = seq
            logits[j] = logits_from is not None and j >= logits_from
        logits[n - 1] = True
        self._decode(n, f"prompt of sequence {seq} at position {pos0}")
        return n - 1

    def prefill(
        self, tokens: Sequence[int], pos0: int, cancel: threading.Event | None = None, *, seq: int = 0
    ) -> int:
        """Evaluate ``tokens`` at positions ``pos0...`` of ``seq`` in :meth:`chunks`.

        Returns the batch index whose logits the sampler reads. Checks
        ``cancel`` between chunks.
        """
        if not tokens:
            raise ValueError("nothing to evaluate")
        last = 0
        for off, n in self.chunks(len(tokens)):
            if cancel is not None and cancel.is_set():
                raise JobCancelled()
            last = self.eval_chunk(tokens[off : off + n], pos0 + off, seq)
        return last

    def decode(self, steps: Sequence[tuple[int, int, int]]) -> None:
        """One ``llama_decode`` of one token per sequence: ``(seq, token, pos)``.

        Row ``i``'s logits belong to ``steps[i]``. Sequences with
        consecutive ids in increasing order make one micro-batch (one pass
        over the weights); a gap starts another (see the module docstring).
        """
        n = len(steps)
        if not 0 < n <= self.n_batch:
            raise ValueError(f"a decode step holds 1..{self.n_batch} tokens, not {n}")
        batch = self._batch
        batch.n_tokens = n
        tok, pos, nseq, seqs, logits = batch.token, batch.pos, batch.n_seq_id, batch.seq_id, batch.logits
        for j, (s, t, p) in enumerate(steps):
            tok[j] = t
            pos[j] = p
            nseq[j] = 1
            seqs[j][0] = s
            logits[j] = True
        self._decode(n, "decode step")

    def chunks(self, n: int) -> list[tuple[int, int]]:
        """(offset, length) batches for ``n`` prompt tokens: full batches, and
        never a last batch of one token after others.

        With flash attention on, llama.cpp's CPU code takes another path for
        a one-token batch (a KV split across threads) whose rounding differs;
        keeping prompt tokens out of it is one of the conditions for a
        token's KV not to depend on where a cache hit ended. (Without flash
        attention results do not depend on the batches at all.)
        """
        return chunk_cuts(n, self.n_batch)

    def logits(self, index: int) -> bytes:
        """The raw float32 logits of batch row ``index`` (for exactness checks)."""
        ptr = _ll.llama_get_logits_ith(self.ctx, index)
        return ctypes.string_at(ptr, 4 * self.n_vocab)

    def check_grammar(self, grammar: str) -> None:
        """Raise :class:`GrammarError` unless llama.cpp parses ``grammar`` (root rule ``root``)."""
        smpl = _ll.llama_sampler_init_grammar(self.vocab, grammar.encode(), b"root")
        if not smpl:
            raise GrammarError("llama.cpp could not parse the grammar")
        _ll.llama_sampler_free(smpl)

    def new_sampler(self, spec: SamplerSpec) -> Any:
        """A llama.cpp sampler chain for one request: grammar (only tokens it
        allows), penalties, then greedy or top-k, top-p, temperature and a
        seeded draw.

        It sees the logits of the request's own row only, so it cannot affect
        other slots. ``llama_sampler_sample`` accepts the drawn token into
        every stage, so the grammar's state and the penalties' history follow
        the output.
        """
        chain = _ll.llama_sampler_chain_init(_ll.llama_sampler_chain_default_params())
        if spec.grammar:
            grammar = _ll.llama_sampler_init_grammar(self.vocab, spec.grammar.encode(), b"root")
            if not grammar:
                _ll.llama_sampler_free(chain)
                raise GrammarError("llama.cpp could not parse the grammar")
            _ll.llama_sampler_chain_add(chain, grammar)
        if spec.presence_penalty or spec.frequency_penalty or spec.repetition_penalty != 1.0:
            _ll.llama_sampler_chain_add(chain, _ll.llama_sampler_init_penalties(
                self.n_vocab, PENALTY_LAST_N, spec.repetition_penalty, spec.frequency_penalty, spec.presence_penalty))
        if spec.temperature <= 0.0:
            _ll.llama_sampler_chain_add(chain, _ll.llama_sampler_init_greedy())
            return chain
        if spec.top_k > 0:
            _ll.llama_sampler_chain_add(chain, _ll.llama_sampler_init_top_k(spec.top_k))
        if spec.top_p < 1.0:
            _ll.llama_sampler_chain_add(chain, _ll.llama_sampler_init_top_p(spec.top_p, 1))
        _ll.llama_sampler_chain_add(chain, _ll.llama_sampler_init_temp(spec.temperature))
        seed = spec.seed if spec.seed is not None else int.from_bytes(os.urandom(4), "little")
        _ll.llama_sampler_chain_add(chain, _ll.llama_sampler_init_dist(seed & 0xFFFFFFFF))
        return chain

    @staticmethod
    def free_sampler(chain: Any) -> None:
        _ll.llama_sampler_free(chain)

    def sample(self, chain: Any, index: int) -> int:
        return int(_ll.llama_sampler_sample(chain, self.ctx, index))

    def token_logprob(self, spec: SamplerSpec, index: int, token: int) -> TokenLogprob | None:
        """What a request that asked for logprobs (``spec.logprobs``) gets for the
        token sampled from batch row ``index``; ``None`` if it did not ask.
        Call it right after sampling, before the next decode overwrites the row."""
        if not spec.logprobs:
            return None
        value, top = self.token_logprobs(index, token, spec.top_logprobs)
        return TokenLogprob(token, self.piece(token), value, tuple((t, self.piece(t), v) for t, v in top))

    def token_logprobs(self, index: int, token: int, top: int) -> tuple[float, list[tuple[int, float]]]:
        """``token``'s log-probability under the model at batch row ``index``
        (the raw distribution, before temperature, penalties or grammar: what
        OpenAI reports), and the ``top`` most likely tokens. Call it before
        the next decode overwrites the row."""
        import numpy as np  # noqa: PLC0415 - a dependency of llama-cpp-python

        ptr = _ll.llama_get_logits_ith(self.ctx, index)
        logits = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).astype(np.float64)
        peak = float(logits.max())
        norm = peak + float(np.log(np.exp(logits - peak).sum()))
        best: list[tuple[int, float]] = []
        if top > 0:
            ids = np.argpartition(-logits, top)[:top]
            ids = ids[np.argsort(-logits[ids], kind="stable")]
            best = [(int(t), float(logits[t]) - norm) for t in ids]
        return float(logits[token]) - norm, best

    # -- saved spans -----------------------------------------------------------
    def _probe_layout(self) -> KvLayout:
        self.clear()
        try:
            self.eval_chunk([self.bos if self.bos >= 0 else 0] * 2, 0, 0)
            return self.save_span(0, 2, seq=0).layout
        finally:
            self.clear()
            self.batches_evaluated = 0

    def save_span(self, start: int, end: int, *, seq: int = 0) -> KvSpan:
        """The KV of positions ``[start, end)`` of ``seq``, copied out of the context.

        llama.cpp serialises the whole sequence; the span is cut from it
        (a copy of just those positions).
        """
        size = int(_ll.llama_state_seq_get_size(self.ctx, seq))
        blob = bytearray(size)
        got = _ll.llama_state_seq_get_data(self.ctx, (ctypes.c_uint8 * size).from_buffer(blob), size, seq)
        if got != size:
            raise DecodeError(f"llama_state_seq_get_data wrote {got} of {size} bytes")
        try:
            whole = parse(blob)
        except KvWindowError as exc:
            raise DecodeError(f"sequence {seq} is longer than the sliding window: {exc}") from exc
        except KvFormatError as exc:
            raise DecodeError(f"unexpected KV state format: {exc}") from exc
        return whole.slice(start, end)

    def restore(self, spans: Sequence[tuple[KvSpan, int, int]], *, seq: int = 0) -> int:
        """Put saved spans back into the (empty) sequence ``seq``, in order.

        ``spans`` are ``(span, start, upto)``: positions ``[start, upto)``
        of each, consecutive from 0. They are written as one blob, so the
        positions land in cells ``0..n-1`` of the sequence's stream exactly
        as if the prefix had been evaluated there: greedy decoding then gives
        the same tokens with or without a cache hit. Returns the restored
        length.
        """
        if not spans:
            return 0
        if spans[0][1] != 0:
            raise RestoreError(f"a restore starts at position 0, not {spans[0][1]}")
        try:
            blob = encode(spans, self.layout)
        except (ValueError, KvFormatError) as exc:
            raise RestoreError(str(exc)) from exc
        upto = spans[-1][2]
        self.clear_seq(seq)
        n = _ll.llama_state_seq_set_data(self.ctx, (ctypes.c_uint8 * len(blob)).from_buffer(blob), len(blob), seq)
        if n == 0:
            self.clear_seq(seq)
            raise RestoreError("llama_state_seq_set_data refused the cached prefix (no room or bad data)")
        lo = int(_ll.llama_memory_seq_pos_min(self.mem, seq))
        hi = int(_ll.llama_memory_seq_pos_max(self.mem, seq))
        if lo != 0 or hi != upto - 1:
            self.clear_seq(seq)
            raise RestoreError(f"restored positions {lo}..{hi}, wanted 0..{upto - 1}")
        return upto

    def measure_state_bytes(self) -> tuple[int, int]:
        """(bytes per cached token, fixed bytes per saved span)."""
        return self.layout.bytes_per_token, 0
