"""What a workload is: prompts with labels, arrival times, and their tokens.

A prompt is kept as text *parts* (or as ready token ids). Each part is
tokenised on its own and the ids are concatenated, so two prompts that share
their first parts share exactly those tokens, whatever the tokenizer would
have merged across a boundary. That is how a client that reuses a prefix
(a few-shot header, a conversation so far) behaves, and it is what makes
prefix caching measurable.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
import bisect
import itertools
import math
import random

from .tokenizer import WorkloadTokenizer

__all__ = [
    "Popularity",
    "Prompt",
    "PromptEncoder",
    "TimedRequest",
    "WeightedChoice",
    "parse_popularity",
    "poisson_arrivals",
    "timed",
]


@dataclass(frozen=True, slots=True)
class Prompt:
    label: str
    """What the prompt is about (an MMLU subject, a conversation id)."""
    parts: tuple[str, ...] = ()
    tokens: tuple[int, ...] | None = None
    """Ready token ids; when set, ``parts`` is ignored."""
    output_tokens: int = 16
    """Tokens the client asks to generate."""
    reply: tuple[str, ...] = ()
    """What the next turn renders right after this prompt (the reply and its
    end of turn), when known: a node with ``reply_cache`` caches it."""
    reply_tokens: tuple[int, ...] | None = None
    """The same as ready token ids; when set, ``reply`` is ignored."""

    def __post_init__(self) -> None:
        if self.tokens is None and not self.parts:
            raise ValueError("a prompt needs text parts or token ids")
        if self.output_tokens < 1:
            raise ValueError("output_tokens must be >= 1")


@dataclass(frozen=True, slots=True)
class TimedRequest:
    t: float
    """Arrival, seconds from the start of the run."""
    prompt: Prompt
    entry: int | None = None
    """Index of the node it arrives at; ``None``: chosen at random."""


class PromptEncoder:
    """Tokenises prompts part by part, each distinct part once."""

    def __init__(self, tokenizer: WorkloadTokenizer) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[tuple[str, bool], tuple[int, ...]] = {}

    def part(self, text: str, *, first: bool) -> tuple[int, ...]:
        key = (text, first)
        ids = self._cache.get(key)
        if ids is None:
            ids = tuple(self.tokenizer.encode(text, bos=first))
            self._cache[key] = ids
        return ids

    def encode_reply(self, prompt: Prompt) -> list[int]:
        """The tokens that follow the prompt in the next turn (empty when unknown)."""
        if prompt.reply_tokens is not None:
            return list(prompt.reply_tokens)
        out: list[int] = []
        for text in prompt.reply:
            out.extend(self.part(text, first=False))
        return out

    def encode(self, prompt: Prompt) -> list[int]:
        if prompt.tokens is not None:
            return list(prompt.tokens)
        out: list[int] = []
        for i, text in enumerate(prompt.parts):
            out.extend(self.part(text, first=i == 0))
        return out


@dataclass(frozen=True)
class Popularity:
    """How often each of ``n`` items is asked for.

    ``uniform``; ``zipf`` with exponent ``s`` (rank r has weight r**-s; s=0
    is uniform); or ``hot``: item 0 gets share ``hot_share``, the others
    split the rest evenly. Ranks are assigned to items by a seeded shuffle
    so that the hot subject is not always the first in alphabetical order.
    """

    kind: str = "uniform"
    s: float = 0.0
    hot_share: float = 0.0
    item: str | None = None
    """Name of the item that takes rank 1 (the hot one), instead of a seeded pick."""

    def weights(self, n: int) -> list[float]:
        if n < 1:
            raise ValueError("no items to choose from")
        if self.kind == "uniform" or (self.kind == "zipf" and self.s == 0):
            return [1.0 / n] * n
        if self.kind == "zipf":
            raw = [r ** -self.s for r in range(1, n + 1)]
        elif self.kind == "hot":
            if n == 1:
                return [1.0]
            raw = [self.hot_share] + [(1 - self.hot_share) / (n - 1)] * (n - 1)
        else:
            raise ValueError(f"unknown popularity {self.kind!r}")
        total = sum(raw)
        return [w / total for w in raw]

    def describe(self) -> str:
        suffix = f":{self.item}" if self.item else ""
        if self.kind == "hot":
            return f"hot:{self.hot_share:g}{suffix}"
        if self.kind == "zipf":
            return f"zipf:{self.s:g}{suffix}"
        return "uniform"


def parse_popularity(text: str) -> Popularity:
    """``uniform``, ``zipf:S`` (S >= 0) or ``hot:SHARE`` (0 < SHARE < 1);
    ``zipf`` and ``hot`` take an optional ``:NAME`` of the top item."""
    kind, _, rest = text.strip().partition(":")
    arg, _, item = rest.partition(":")
    try:
        if kind == "uniform" and not rest:
            return Popularity()
        if kind == "zipf":
            s = float(arg)
            if not 0 <= s <= 10 or math.isnan(s):
                raise ValueError
            return Popularity("zipf", s=s, item=item or None)
        if kind == "hot":
            share = float(arg)
            if not 0 < share < 1:
                raise ValueError
            return Popularity("hot", hot_share=share, item=item or None)
    except ValueError:
        pass
    raise ValueError(f"popularity must be uniform, zipf:S[:NAME] (S in 0..10) or hot:SHARE[:NAME] (SHARE in 0..1), not {text!r}")


class WeightedChoice:
    """Draws indices with fixed weights in O(log n), from a given RNG."""

    def __init__(self, weights: Sequence[float]) -> None:
        self._cum = list(itertools.accumulate(weights))
        self._total = self._cum[-1]

    def draw(self, rng: random.Random) -> int:
        return min(bisect.bisect_right(self._cum, rng.random() * self._total), len(self._cum) - 1)


def poisson_arrivals(n: int, rate: float, rng: random.Random, start: float = 0.0) -> list[float]:
    """``n`` arrival times of a Poisson process of ``rate`` per second."""
    if rate <= 0:
        raise ValueError("rate must be > 0")
    t = start
    out: list[float] = []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def timed(prompts: Iterable[Prompt], times: Iterable[float]) -> list[TimedRequest]:
    return [TimedRequest(t, p) for p, t in zip(prompts, times, strict=True)]
