"""An example engine plugin: echoes the prompt back, with a real prefix cache."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
import time
from typing import Any

import trio

from p2pinfer.core.blocks import ModelFingerprint
from p2pinfer.core.peers import Load
from p2pinfer.core.radix import RadixTree
from p2pinfer.engines import Engine, GenerationParams, GenerationRecord, TokenChunk

__all__ = ["EchoEngine"]


class EchoEngine(Engine):
    """Tokens are UTF-8 bytes; the answer is the prompt, one byte per step."""

    name = "echo"

    def __init__(self, *, cache_tokens: int = 100_000, context_size: int = 4096, **_ignored: Any) -> None:
        self._cache = RadixTree(capacity_tokens=cache_tokens)
        self._context = context_size
        self._fingerprint = ModelFingerprint("echo-v1", "utf8-bytes", "")

    @property
    def fingerprint(self) -> ModelFingerprint:
        return self._fingerprint

    @property
    def cache(self) -> RadixTree:
        return self._cache

    @property
    def context_size(self) -> int:
        return self._context

    @property
    def vocab_size(self) -> int:
        return 256

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        return list(text.encode("utf-8"))

    def detokenize(self, tokens: Sequence[int]) -> str:
        return bytes(tokens).decode("utf-8", "replace")

    def chat_tokens(self, messages: Sequence[Any]) -> list[int]:
        return self.tokenize("".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: ")

    def load(self) -> Load:
        return Load(queued_prefill_tokens=0, prefill_ms_per_token=0.001, active_requests=0)

    async def generate(
        self, tokens: Sequence[int], params: GenerationParams
    ) -> AsyncIterator[TokenChunk | GenerationRecord]:
        self.validate_tokens(tokens, params)
        t0 = time.perf_counter()
        reused = min(self._cache.match(tokens), len(tokens) - 1)
        self._cache.insert(tokens)
        out = list(tokens[: params.max_tokens])
        for i, token in enumerate(out):
            await trio.sleep(0)
            yield TokenChunk((token,), self.detokenize([token]))
        elapsed = time.perf_counter() - t0
        yield GenerationRecord(len(tokens), reused, len(out), elapsed, elapsed, "length")
