"""The *simulated* engine: a cost model with a real radix cache, no weights.

It exists for the simulator and for network tests at scale, where loading a
real model per node would be too slow. Prefix caching is real (a
:class:`~p2pinfer.core.radix.RadixTree` under a token budget, with pinning
while a request runs); time is not: each request sleeps for what
:class:`~p2pinfer.core.costmodel.EngineCostModel` says the real engine
would take. Its "text" is made of the prompt's own pieces, so it is not a
language model and never claims to be one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
import math
import time
from typing import Any

import trio

from ..core.blocks import DEFAULT_BLOCK_SIZE, ModelFingerprint
from ..core.costmodel import EngineCostModel
from ..core.engine_queue import EngineQueue, QueueFull
from ..core.peers import Load
from ..core.radix import RadixTree
from .approx_tokenizer import ApproxTokenizer
from .base import (
    ChatMessage,
    Engine,
    EngineOverloadedError,
    GenerationParams,
    GenerationRecord,
    InvalidRequestError,
    PositionScore,
    TokenChunk,
    with_tool_instructions,
)
from .text_stream import TextStream

__all__ = ["SIMULATED_CHECK_CHUNK", "SIMULATED_TOP_PROBABILITY", "SimulatedEngine", "simulated_next_token"]

SIMULATED_TOP_PROBABILITY = 0.9
"""The simulated engine's "model", for :meth:`SimulatedEngine.score`: its next
token (:func:`simulated_next_token`) has this probability, every other token
an equal share of the rest."""


SIMULATED_CHECK_CHUNK = 128
"""Tokens of an answer check the simulated engine prefills per turn (the llama.cpp engine's CPU batch)."""


def simulated_next_token(seq: Sequence[int]) -> int:
    """The simulated engine's next token after ``seq``: a piece of ``seq``
    chosen by its last token and its length (so an answer continued from any
    of its tokens goes on exactly as it would have)."""
    return seq[(7 * seq[-1] + 13) % len(seq)]


class SimulatedEngine(Engine):
    """Simulated engine (cost model + real radix cache); see module docstring."""

    name = "simulated"

    def __init__(
        self,
        *,
        model: str = "simulated-smollm2-135m",
        cache_tokens: int = 200_000,
        context_size: int = 8192,
        cost: EngineCostModel | None = None,
        speed: float = 1.0,
        max_queue: int = 256,
        block_size: int = DEFAULT_BLOCK_SIZE,
        chat_template: str = "chatml-approx-v1",
        vocab_size: int = 49152,
        reply_cache: bool = False,
        check_cache: bool = True,
        **_ignored: Any,
    ) -> None:
        """``speed`` scales the cost model: 0 makes every request instant.

        ``reply_cache`` can only be off: its generated tokens echo the prompt,
        no chat template renders them again, so there is no next turn to
        cache them for (the simulator models reply caching itself:
        ``p2pinfer simulate --workload conversations``).
        """
        if reply_cache:
            raise ValueError("the simulated engine cannot cache replies (its tokens are not a model's); use --no-reply-cache")
        self._tokenizer = ApproxTokenizer(vocab_size)
        self._fingerprint = ModelFingerprint(
            model=model, tokenizer=f"approx-v1-{vocab_size}", chat_template=chat_template, block_size=block_size
        )
        self._cache = RadixTree(capacity_tokens=cache_tokens)
        self._context = context_size
        self.cost = (cost or EngineCostModel()).scaled(speed)
        self._lock = trio.Lock()  # FIFO: one request at a time, like one llama.cpp context
        # Its speed is its cost model's, known: nothing to measure.
        self.queue = EngineQueue(ms_per_token=self.cost.prefill_ms_per_token, max_queue=max_queue)
        self.check_cache = check_cache
        """An answer check leaves its prompt cached (the node setting ``check_cache``)."""
        self.check_tokens_reused = 0
        """Prompt tokens answer checks found cached (not prefilled)."""
        self.check_tokens_prefilled = 0

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
        return self._tokenizer.vocab_size

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        return self._tokenizer.encode(text)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self._tokenizer.decode(tokens)

    def chat_tokens(self, messages: Sequence[ChatMessage], tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
        if tools:
            messages = with_tool_instructions(messages, tools)
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return self.tokenize(text + "<|im_start|>assistant\n")

    def load(self) -> Load:
        return self.queue.load()

    async def generate(
        self, tokens: Sequence[int], params: GenerationParams
    ) -> AsyncIterator[TokenChunk | GenerationRecord]:
        self.validate_tokens(tokens, params)
        # Its tokens come from a cost model, not a distribution: nothing to constrain, penalise or score.
        for name, asked in (("grammar", params.grammar is not None), ("logprobs", params.logprobs),
                            ("presence_penalty, frequency_penalty, repetition_penalty", params.penalised)):
            if asked:
                raise InvalidRequestError(f"the simulated engine cannot honour {name}")
        tokens = list(tokens)
        t0 = time.perf_counter()
        try:
            # Touch: the prefix is used from now on (see the llama.cpp engine; issue 22).
            ticket = self.queue.admit(tokens, self._cache.match(tokens))
        except QueueFull as exc:
            raise EngineOverloadedError(str(exc)) from None
        try:
            async with self._lock:
                queue_s = time.perf_counter() - t0
                reused = self._cache.match(tokens)
                self.queue.start(ticket, reused)
                pin = self._cache.pin(tokens[:reused])
                try:
                    await trio.sleep(self.cost.prefill_ms(len(tokens), reused) / 1000)
                    self._cache.insert(tokens)
                finally:
                    self._cache.unpin(pin)
                self.queue.prefilled(ticket)
                ttft = time.perf_counter() - t0
                out: list[int] = []
                # Echo pieces of the prompt: deterministic, a function of the sequence so far.
                seq = list(tokens)
                text = TextStream(params.stop)  # stop strings end the answer, as in llama.cpp's engine
                for i in range(params.max_tokens):
                    if i:
                        await trio.sleep(self.cost.decode_ms_per_token / 1000)
                    token = simulated_next_token(seq)
                    seq.append(token)
                    out.append(token)
                    piece = text.feed(self.token_bytes(token))
                    if i + 1 == params.max_tokens:
                        piece += text.flush()
                    yield TokenChunk((token,), piece)
                    if text.stopped:
                        break
                yield GenerationRecord(
                    prompt_tokens=len(tokens),
                    reused_tokens=reused,
                    generated_tokens=len(out),
                    ttft_s=ttft,
                    total_s=time.perf_counter() - t0,
                    finish_reason="stop" if text.stopped else "length",
                    queue_s=queue_s,
                )
        finally:
            self.queue.finish(ticket)

    can_score = True

    async def score(self, tokens: Sequence[int], start: int, *, temperature: float = 1.0) -> list[PositionScore]:
        """Scores under the simulated "model" (:data:`SIMULATED_TOP_PROBABILITY`
        on :func:`simulated_next_token`), after the cost of prefilling what
        the cache does not hold of ``tokens[:start - 1]`` and the rest.

        It is background work as in the llama.cpp engine: its tokens count in
        the queue's ``background_queued``, not in the load's queued prefill,
        and it takes the engine (one request at a time) for one chunk of
        :data:`SIMULATED_CHECK_CHUNK` tokens at a time, so a request waiting
        goes before its next chunk (trio's lock is FIFO, which also means a
        check always gets its turn). Its prompt, ``tokens[:start]``, is cached
        at the end (unless ``check_cache`` is off), as the llama.cpp engine's
        check leaves it.
        """
        self.validate_score(tokens, start, temperature)
        tokens = list(tokens)
        cached = min(self._cache.match(tokens, touch=False), start - 1)
        try:
            ticket = self.queue.admit(tokens, cached, background=True)
        except QueueFull as exc:
            raise EngineOverloadedError(str(exc)) from None
        try:
            self.queue.start(ticket, cached)
            pos, new = cached, len(tokens) - cached
            total_ms = self.cost.prefill_ms(len(tokens), cached)
            while pos < len(tokens):
                size = min(SIMULATED_CHECK_CHUNK, len(tokens) - pos)
                async with self._lock:
                    await trio.sleep(total_ms * size / new / 1000)
                pos += size
            self.queue.prefilled(ticket)
            if self.check_cache:
                self._cache.insert(tokens[:start])
            self.check_tokens_reused += cached
            self.check_tokens_prefilled += len(tokens) - cached
        finally:
            self.queue.finish(ticket)
        vocab = self.vocab_size
        # Temperature t: probabilities proportional to p ** (1 / t).
        top = math.log(SIMULATED_TOP_PROBABILITY) / temperature
        rest = math.log((1 - SIMULATED_TOP_PROBABILITY) / (vocab - 1)) / temperature
        norm = max(top, rest) + math.log(math.exp(top - max(top, rest)) + (vocab - 1) * math.exp(rest - max(top, rest)))
        top, rest = top - norm, rest - norm
        p_top = math.exp(top)
        mean = p_top * top + (1 - p_top) * rest
        var = p_top * (top - mean) ** 2 + (1 - p_top) * (rest - mean) ** 2
        out = []
        for i in range(start, len(tokens)):
            best = simulated_next_token(tokens[:i])
            t = tokens[i]
            out.append(PositionScore(t, top if t == best else rest, best, top, mean, var))
        return out
