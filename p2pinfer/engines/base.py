"""The engine interface every backend implements.

The routing layer sees an engine only through this class: its
:class:`~p2pinfer.core.blocks.ModelFingerprint` (which seeds block hashes),
its tokenizer and chat template (requests are tokenised once, at the entry
node), its prefix cache as a :class:`~p2pinfer.core.radix.RadixTree` that is
kept equal to what the engine really holds, and its load.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from ..core.blocks import ModelFingerprint
from ..core.peers import Load
from ..core.radix import RadixTree

__all__ = [
    "ChatMessage",
    "Engine",
    "EngineError",
    "GenerationParams",
    "GenerationRecord",
    "InvalidRequestError",
    "PromptTooLongError",
    "TokenChunk",
    "EngineOverloadedError",
]

ChatMessage = Mapping[str, str]
FinishReason = Literal["stop", "length", "cancelled", "error"]

MAX_TOKENS_LIMIT = 8192


class EngineError(RuntimeError):
    """The engine failed this request; the node keeps serving."""


class InvalidRequestError(EngineError, ValueError):
    """The request itself is wrong (bad token ids, impossible parameters)."""


class PromptTooLongError(InvalidRequestError):
    """Prompt plus ``max_tokens`` does not fit the context."""


class EngineOverloadedError(EngineError):
    """The engine's queue is full; retry elsewhere or later."""


@dataclass(frozen=True, slots=True)
class GenerationParams:
    max_tokens: int = 64
    temperature: float = 0.0
    """0 means greedy (deterministic)."""
    top_p: float = 1.0
    top_k: int = 40
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def validate(self) -> None:
        """Raise :class:`InvalidRequestError` for impossible parameters."""
        if not isinstance(self.max_tokens, int) or not 1 <= self.max_tokens <= MAX_TOKENS_LIMIT:
            raise InvalidRequestError(f"max_tokens must be an integer in 1..{MAX_TOKENS_LIMIT}")
        if not 0.0 <= self.temperature <= 5.0:
            raise InvalidRequestError("temperature must be in 0..5")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError("top_p must be in (0, 1]")
        if not 0 <= self.top_k <= 100_000:
            raise InvalidRequestError("top_k must be in 0..100000")
        if len(self.stop) > 8 or any(not s or len(s) > 64 for s in self.stop):
            raise InvalidRequestError("at most 8 stop strings of 1..64 characters")


@dataclass(frozen=True, slots=True)
class TokenChunk:
    """Newly generated tokens and the text they completed."""

    token_ids: tuple[int, ...]
    text: str


@dataclass(frozen=True, slots=True)
class GenerationRecord:
    """The last item of every generation: what really happened."""

    prompt_tokens: int
    reused_tokens: int
    """Prompt tokens whose KV came from the cache (not recomputed)."""
    generated_tokens: int
    ttft_s: float
    total_s: float
    finish_reason: FinishReason
    queue_s: float = 0.0
    """Time spent waiting for the engine before prefill started."""
    extra: dict[str, Any] = field(default_factory=dict)


class Engine(ABC):
    """Abstract inference engine; see the module docstring.

    Implementations register under the entry point group
    ``p2pinfer.engines`` and are built with ``Engine.create(**options)``.
    """

    name: ClassVar[str] = "abstract"

    @classmethod
    def create(cls, **options: Any) -> Engine:
        """Build from CLI/config options; unknown options raise ``TypeError``."""
        return cls(**options)

    @property
    @abstractmethod
    def fingerprint(self) -> ModelFingerprint: ...

    @property
    @abstractmethod
    def cache(self) -> RadixTree:
        """The prefix cache as it really is right now; subscribe for events."""

    @property
    @abstractmethod
    def context_size(self) -> int: ...

    @property
    def model_name(self) -> str:
        return self.fingerprint.model

    @abstractmethod
    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]: ...

    @abstractmethod
    def detokenize(self, tokens: Sequence[int]) -> str: ...

    @abstractmethod
    def chat_tokens(self, messages: Sequence[ChatMessage]) -> list[int]:
        """Messages through the model's own chat template, with the generation prompt."""

    @abstractmethod
    def generate(self, tokens: Sequence[int], params: GenerationParams) -> AsyncIterator[TokenChunk | GenerationRecord]:
        """Stream :class:`TokenChunk` items, then exactly one :class:`GenerationRecord`.

        Raises :class:`InvalidRequestError` (before anything is yielded) for
        a bad request and :class:`EngineError` for a failure. Cancelling the
        iteration frees the engine for the next request.
        """

    @abstractmethod
    def load(self) -> Load:
        """Queued prefill tokens and the prefill speed measured online."""

    def validate_tokens(self, tokens: Sequence[int], params: GenerationParams) -> None:
        """Shared request checks; backends call this before queueing."""
        params.validate()
        if not tokens:
            raise InvalidRequestError("the prompt is empty")
        vocab = self.vocab_size
        for t in tokens:
            if type(t) is not int or not 0 <= t < vocab:
                raise InvalidRequestError(f"token id {t!r} is outside the vocabulary (0..{vocab - 1})")
        if len(tokens) + params.max_tokens > self.context_size:
            raise PromptTooLongError(
                f"prompt of {len(tokens)} tokens plus max_tokens {params.max_tokens} exceeds "
                f"the context of {self.context_size} tokens"
            )

    @property
    @abstractmethod
    def vocab_size(self) -> int: ...

    async def aclose(self) -> None:
        """Release model memory; the default has nothing to release."""

    def describe(self) -> dict[str, Any]:
        """Facts for /status and benchmark output."""
        return {
            "engine": self.name,
            "model": self.model_name,
            "fingerprint": self.fingerprint.hex(),
            "context_size": self.context_size,
            "cached_tokens": self.cache.total_tokens,
        }
