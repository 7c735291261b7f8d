"""The engine interface every backend implements.

The routing layer sees an engine only through this class: its
:class:`~p2pinfer.core.blocks.ModelFingerprint` (which seeds block hashes),
its tokenizer and chat template (requests are tokenised once, at the entry
node), its prefix cache as a :class:`~p2pinfer.core.radix.RadixTree` that is
kept equal to what the engine really holds, and its load.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from ..core.blocks import ModelFingerprint
from ..core.peers import Load
from ..core.radix import RadixTree
from .reply_saves import ReplySaves

__all__ = [
    "ChatMessage",
    "Engine",
    "EngineError",
    "GenerationParams",
    "GenerationRecord",
    "InvalidRequestError",
    "PositionScore",
    "PromptTooLongError",
    "TokenChunk",
    "TokenLogprob",
    "EngineOverloadedError",
    "with_tool_instructions",
]

ChatMessage = Mapping[str, str]
FinishReason = Literal["stop", "length", "cancelled", "error"]

MAX_TOKENS_LIMIT = 8192
MAX_TOP_LOGPROBS = 20
MAX_GRAMMAR_CHARS = 65536


def with_tool_instructions(messages: Sequence[ChatMessage], tools: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """The messages with a system instruction that lists ``tools``, for a chat
    template that has no tools section of its own.

    The instruction asks for the form the tool-call grammar enforces
    (``{"name": ..., "arguments": {...}}``), so the model sees what it will
    be made to write.
    """
    import json  # noqa: PLC0415

    functions = [t.get("function", t) for t in tools]
    text = (
        "You can call functions. To call one, answer with only a JSON object "
        '{"name": <function name>, "arguments": <object matching its parameters>}. '
        "The functions:\n" + json.dumps(functions, ensure_ascii=False)
    )
    out = [dict(m) for m in messages]
    if out and out[0].get("role") == "system":
        out[0]["content"] = f"{out[0]['content']}\n\n{text}"
    else:
        out.insert(0, {"role": "system", "content": text})
    return out


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
    presence_penalty: float = 0.0
    """OpenAI's: subtracted from the logit of every token already generated."""
    frequency_penalty: float = 0.0
    """OpenAI's: subtracted once per earlier occurrence of the token."""
    repetition_penalty: float = 1.0
    """llama.cpp's (CTRL's) multiplicative penalty on repeated tokens; 1 = off."""
    grammar: str | None = None
    """GBNF that constrains sampling (JSON mode, a JSON schema, tool calls)."""
    logprobs: bool = False
    """Return each generated token's log-probability (:attr:`TokenChunk.logprobs`)."""
    top_logprobs: int = 0
    """And this many most likely alternatives per position."""

    @property
    def penalised(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

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
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise InvalidRequestError(f"{name} must be in -2..2")
        if not 0.0 < self.repetition_penalty <= 2.0:
            raise InvalidRequestError("repetition_penalty must be in (0, 2]")
        if self.grammar is not None and not 1 <= len(self.grammar) <= MAX_GRAMMAR_CHARS:
            raise InvalidRequestError(f"grammar must be 1..{MAX_GRAMMAR_CHARS} characters")
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise InvalidRequestError(f"top_logprobs must be in 0..{MAX_TOP_LOGPROBS}")
        if self.top_logprobs and not self.logprobs:
            raise InvalidRequestError("top_logprobs needs logprobs")


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One generated token's log-probability, and the most likely alternatives."""

    token_id: int
    piece: bytes
    """The token's bytes (a token may hold part of a UTF-8 character)."""
    logprob: float
    top: tuple[tuple[int, bytes, float], ...] = ()
    """(token id, bytes, log-probability), most likely first."""


@dataclass(frozen=True, slots=True)
class TokenChunk:
    """Newly generated tokens and the text they completed."""

    token_ids: tuple[int, ...]
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()
    """One per token id when the request asked for logprobs, else empty."""


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


@dataclass(frozen=True, slots=True)
class PositionScore:
    """What the engine's model says of one token given the tokens before it
    (:meth:`Engine.score`): enough to verify a peer's answer
    (:mod:`p2pinfer.core.verify`) without shipping the vocabulary's logits.

    Log-probabilities are of the distribution at ``temperature`` (softmax of
    logits / temperature; 1 for the raw distribution), before top-k, top-p,
    penalties or grammar.
    """

    token_id: int
    logprob: float
    """Log-probability of ``token_id`` here."""
    best_token: int
    best_logprob: float
    """The most likely token and its log-probability (the greedy choice)."""
    mean_logprob: float
    """E[log p] of a token drawn from this distribution (minus its entropy)."""
    var_logprob: float
    """Var[log p] of a token drawn from it: with ``mean_logprob``, the
    log-likelihood test of a sampled answer."""


class Engine(ABC):
    """Abstract inference engine; see the module docstring.

    Implementations register under the entry point group
    ``p2pinfer.engines`` and are built with ``Engine.create(**options)``.
    """

    name: ClassVar[str] = "abstract"
    reply_saves: ReplySaves | None = None
    """Replies saved for the next turn after their requests ended (``/status``,
    ``/metrics``); None for an engine that saves none."""

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
    def chat_tokens(self, messages: Sequence[ChatMessage], tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
        """Messages through the model's own chat template, with the generation prompt.

        ``tools`` (OpenAI's list): rendered by the template where it has a
        tools section, else as a system instruction
        (:func:`with_tool_instructions`)."""

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

    can_score: ClassVar[bool] = False
    """Whether :meth:`score` is implemented (a node verifies peers' answers only then)."""

    async def score(self, tokens: Sequence[int], start: int, *, temperature: float = 1.0) -> list[PositionScore]:
        """Score ``tokens[start:]``, each given the tokens before it, in one prefill.

        One :class:`PositionScore` per position ``start..len(tokens)-1``. It
        is background work (an answer check): it may reuse the cached prefix
        of ``tokens[:start]``, and it leaves that prompt cached, as serving
        it would, so that the next check of a prompt sharing its prefix (the
        same few-shot header, the same conversation) costs only what is new,
        and the node's digest says what it now holds; it yields to
        requests' prefill, and it is admitted to the engine's queue with
        ``EngineQueue.admit(..., background=True)``, so it holds a slot in
        :meth:`load` without counting in the queued prefill. Raises
        :class:`InvalidRequestError` for bad tokens or ``start`` outside
        ``1..len(tokens)-1``.
        """
        raise NotImplementedError(f"the {self.name} engine cannot score tokens")

    def validate_score(self, tokens: Sequence[int], start: int, temperature: float) -> None:
        """Shared checks of a :meth:`score` call."""
        if not 1 <= start < len(tokens):
            raise InvalidRequestError(f"start must be in 1..{len(tokens) - 1} (got {start})")
        if len(tokens) > self.context_size:
            raise PromptTooLongError(f"{len(tokens)} tokens exceed the context of {self.context_size} tokens")
        if not 0.0 < temperature <= 5.0:
            raise InvalidRequestError("temperature must be in (0, 5]")
        vocab = self.vocab_size
        for t in tokens:
            if type(t) is not int or not 0 <= t < vocab:
                raise InvalidRequestError(f"token id {t!r} is outside the vocabulary (0..{vocab - 1})")

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

    def token_bytes(self, token: int) -> bytes:
        """The bytes one token stands for: an origin renders a peer's answer with these
        (the peer's own text is never shown, since answer checks judge token ids only).

        Raises :class:`InvalidRequestError` for an id outside the vocabulary. The
        default decodes the one token, which is exact only for tokenizers whose
        tokens are whole characters; byte-level backends override it."""
        if type(token) is not int or not 0 <= token < self.vocab_size:
            raise InvalidRequestError(f"token id {token!r} is outside the vocabulary (0..{self.vocab_size - 1})")
        return self.detokenize([token]).encode()

    async def aclose(self) -> None:
        """Release model memory; the default has nothing to release."""

    @property
    def failure(self) -> str | None:
        """Why this engine can no longer generate (its worker died), or None while it can.

        The node reports it: ``/health`` answers 503, and the node says it is
        busy so that peers stop sending it work."""
        return None

    async def wait_reply_saves(self) -> None:
        """Until no reply is being saved (those started before or while this waits): a
        benchmark that times one request after another waits here between them, untimed."""

    def watch_reply_saves(self, listener: Callable[[Sequence[int], bool], None]) -> None:
        """Call ``listener(path, True)`` when a reply starts being saved after its
        request ended (``path``: prompt + reply as the cache will hold them) and
        ``listener(path, False)`` once the save ended (the reply in the cache by
        then, or not at all), so that the node can list ``path`` in its digest
        meanwhile as a prompt in service. An engine that saves no replies never calls it."""

    def describe(self) -> dict[str, Any]:
        """Facts for /status and benchmark output."""
        out: dict[str, Any] = {
            "engine": self.name,
            "model": self.model_name,
            "fingerprint": self.fingerprint.hex(),
            "context_size": self.context_size,
            "cached_tokens": self.cache.total_tokens,
        }
        if self.reply_saves is not None:
            out["reply_saves"] = self.reply_saves.as_dict()
        return out
