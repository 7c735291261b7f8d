"""Multi-turn conversations that grow: each turn resends the whole history.

Turn k's prompt is the system prompt, every earlier (user, assistant) pair,
then the new user message; so it extends turn k-1's prompt, and only the
node that served turn k-1 can reuse it. Users pick their next turn at
random among the conversations in flight, so a conversation's turns land on
random entry nodes: the router has to find the history.

The text is real: user messages are MMLU test questions (in a chat
template like SmolLM2's), assistant replies are the answer and its text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import random

from .base import Prompt
from .mmlu import MMLUQuestion, MMLUSubject, format_question

__all__ = ["ConversationWorkload"]

SYSTEM_PROMPT = (
    "<|im_start|>system\nYou are a careful tutor. Answer each multiple choice question with the letter "
    "of the correct choice, then repeat that choice and explain it in one or two sentences. Keep the "
    "whole conversation in mind: later questions may refer to earlier ones.<|im_end|>\n"
)


def _user(q: MMLUQuestion) -> str:
    return f"<|im_start|>user\n{format_question(q, with_answer=False)}<|im_end|>\n<|im_start|>assistant\n"


def _reply(q: MMLUQuestion) -> str:
    choice = q.choices["ABCD".index(q.answer)]
    return f"The answer is {q.answer}: {choice}. This choice is the one that fits the question as asked.<|im_end|>\n"


@dataclass
class _Conversation:
    cid: int
    questions: list[MMLUQuestion]
    turns_done: int = 0
    parts: list[str] = field(default_factory=list)


class ConversationWorkload:
    """``active`` conversations in flight, each ``turns`` (min, max) turns long."""

    def __init__(
        self,
        subjects: list[MMLUSubject],
        *,
        active: int = 64,
        turns: tuple[int, int] = (2, 8),
        reply_tokens: int = 48,
        seed: int = 0,
    ) -> None:
        if active < 1 or not 1 <= turns[0] <= turns[1]:
            raise ValueError("need active >= 1 and 1 <= min turns <= max turns")
        self.pool = [q for s in subjects for q in s.test]
        self.active = active
        self.turns = turns
        self.reply_tokens = reply_tokens
        self._next_id = 0
        self._rng = random.Random(f"conversations-{seed}")
        self._live = [self._new() for _ in range(active)]

    def _new(self) -> _Conversation:
        n = self._rng.randint(*self.turns)
        conv = _Conversation(self._next_id, self._rng.sample(self.pool, n), parts=[SYSTEM_PROMPT])
        self._next_id += 1
        return conv

    def draw(self, rng: random.Random) -> Prompt:
        slot = rng.randrange(len(self._live))
        conv = self._live[slot]
        q = conv.questions[conv.turns_done]
        conv.parts.append(_user(q))
        reply = _reply(q)
        prompt = Prompt(f"conv-{conv.cid}", tuple(conv.parts), output_tokens=self.reply_tokens, reply=(reply,))
        conv.parts.append(reply)  # what the assistant said is part of the next turn
        conv.turns_done += 1
        if conv.turns_done == len(conv.questions):
            self._live[slot] = self._new()
        return prompt

    def prompts(self, n: int, rng: random.Random) -> list[Prompt]:
        return [self.draw(rng) for _ in range(n)]
