"""Where a re-rendered conversation stops matching what the engine generated.

For a reply to join the prefix cache usefully (issue 16, part 1), the next
turn's prompt must start with the previous prompt *and* the generated tokens
as they were generated. It need not: the chat template renders the reply
from its text (which may tokenise differently from the generated ids) and
adds its own end-of-turn markup (which the engine stopped at, or never
generated). This measures, per conversation, the longest common prefix of
``prompt + generated`` and the next turn's rendered prompt, and what each
holds where they part.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import trio

from ..engines.base import Engine, GenerationParams, TokenChunk

__all__ = ["COMPLETIONS", "CONVERSATIONS", "reply_alignment"]

CONVERSATIONS: tuple[tuple[str, str, str], ...] = (
    ("You are a helpful assistant.", "Name three rivers in Europe.", "Which of them is the longest?"),
    ("You answer in one short sentence.", "What is a prefix cache?", "And why does it help?"),
    ("You are a poet.", "Write two lines about the sea.", "Now two about the mountains."),
    ("You are terse.", "Give me a JSON object with a name and an age.", "Add a city."),
)


COMPLETIONS: tuple[tuple[str, str], ...] = (
    ("The three longest rivers in Europe are", "\nThe longest of them is"),
    ("A prefix cache is", " It helps because"),
    ("Here are two lines about the sea:\n", "\nAnd two about the mountains:\n"),
    ('{"name": "Ada", "age":', ', "city":'),
)
"""Completion prompts and what a client appends after the reply for its next request."""


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


async def _one(engine: Engine, system: str, first: str, second: str, max_tokens: int) -> dict[str, Any]:
    history = [{"role": "system", "content": system}, {"role": "user", "content": first}]
    prompt = engine.chat_tokens(history)
    generated: list[int] = []
    text = []
    finish = ""
    async for item in engine.generate(prompt, GenerationParams(max_tokens=max_tokens, temperature=0.0)):
        if isinstance(item, TokenChunk):
            generated.extend(item.token_ids)
            text.append(item.text)
        else:
            finish = item.finish_reason
    reply = "".join(text)
    nxt = engine.chat_tokens([*history, {"role": "assistant", "content": reply}, {"role": "user", "content": second}])
    return _row(engine, prompt, generated, finish, reply, nxt)


def _row(engine: Engine, prompt: list[int], generated: list[int], finish: str, reply: str,
         nxt: list[int]) -> dict[str, Any]:
    ran = prompt + generated
    common = _common(ran, nxt)
    return {
        "prompt_tokens": len(prompt),
        "generated_tokens": len(generated),
        "finish_reason": finish,
        "next_prompt_tokens": len(nxt),
        "common_prefix_tokens": common,
        "reply_tokens_matching": max(0, min(common, len(ran)) - len(prompt)),
        "all_generated_tokens_match": common >= len(ran),
        "generated_after_divergence": engine.detokenize(ran[common:common + 6]),
        "rendered_after_divergence": engine.detokenize(nxt[common:common + 6]),
        "rendered_ids_after_divergence": nxt[common:common + 3],
        "retokenised_reply_equals_generated": engine.tokenize(reply, add_special=False) == generated,
        "cache_match_of_next_prompt": engine.cache.match(nxt, touch=False),
        "reply_cache": bool(engine.describe().get("reply_cache", False)),
    }


async def _one_completion(engine: Engine, prompt_text: str, more: str, max_tokens: int) -> dict[str, Any]:
    """A completion, then the next request a client continuing it sends: prompt + reply + more text."""
    prompt = engine.tokenize(prompt_text)
    generated: list[int] = []
    text = []
    finish = ""
    async for item in engine.generate(prompt, GenerationParams(max_tokens=max_tokens, temperature=0.0)):
        if isinstance(item, TokenChunk):
            generated.extend(item.token_ids)
            text.append(item.text)
        else:
            finish = item.finish_reason
    reply = "".join(text)
    return _row(engine, prompt, generated, finish, reply, engine.tokenize(prompt_text + reply + more))


def reply_alignment(engine: Engine, max_tokens: int = 48, *, completion: bool = False) -> dict[str, Any]:
    """Every conversation of :data:`CONVERSATIONS` (or, ``completion``, every
    prompt of :data:`COMPLETIONS`) through ``engine`` (greedy)."""

    async def main() -> list[dict[str, Any]]:
        if completion:
            return [await _one_completion(engine, *c, max_tokens) for c in COMPLETIONS]
        return [await _one(engine, *c, max_tokens) for c in CONVERSATIONS]

    rows = trio.run(main)
    return {
        "model": engine.model_name,
        "mode": "completion" if completion else "chat",
        "max_tokens": max_tokens,
        "conversations": rows,
        "all_replies_match_up_to_their_last_generated_token": all(r["all_generated_tokens_match"] for r in rows),
    }
