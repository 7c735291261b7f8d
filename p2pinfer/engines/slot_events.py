"""What the slot loop tells the engine about a job (loop thread -> trio).

Plain data, no llama.cpp: the engine module imports these without loading
the C library. A job's events come in this order: :class:`Restored` (it has
a slot), token chunks, :class:`Prefilled` (right after the first chunk),
more chunks, then :class:`SavingReply` with the last chunk when its reply
is evaluated again for the cache (the answer is complete then; the save goes
on in the background), then exactly one :class:`Finished` or
:class:`Failed`, after which the job no longer holds its slot. A job
cancelled or failed before it got a slot posts only the last event.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

from .base import TokenChunk

if TYPE_CHECKING:
    from .kv_state import KvSpan

__all__ = ["Event", "Failed", "Finished", "Prefilled", "Restored", "SavingReply"]


@dataclass(frozen=True, slots=True)
class Restored:
    """The job has a slot; ``reused`` cached tokens are in its sequence."""

    slot: int
    reused: int
    restore_s: float
    error: str | None = None
    """Why the planned prefix could not be restored (it is then recomputed)."""


@dataclass(frozen=True, slots=True)
class Prefilled:
    """The prompt is evaluated and its first token was sent before this."""

    prefill_s: float
    """Time the job's own prompt chunks took (other slots' steps in between excluded)."""
    wall_s: float
    """From its first chunk to its first token, interleaved steps included."""
    span: KvSpan | None
    """The prompt's new positions ``[save_from, n)`` for the cache (None: not asked, or failed)."""
    save_error: str | None = None


@dataclass(frozen=True, slots=True)
class SavingReply:
    """The generation ended (its last token went out before this): the request's
    answer is complete, and the engine ends its stream here. The job keeps its
    slot while its reply's ``tokens`` are evaluated again as prompt chunks, one
    per loop iteration like any prefill, then :class:`Finished` follows (with
    the span, or a note saying why there is none) once the reply is saved."""

    reason: str
    """stop or length."""
    generated: int
    decode_steps: int
    decode_s: float
    tokens: tuple[int, ...]
    """What is evaluated again after the prompt: the reply's tokens and the end of turn."""


@dataclass(frozen=True, slots=True)
class Finished:
    """The job left its slot: ``reason`` is stop, length or cancelled."""

    reason: str
    generated: int
    decode_steps: int
    decode_s: float
    reply_span: KvSpan | None = None
    """KV of the reply as the next turn renders it, positions ``[n, n + len(reply_tokens))``
    (see :class:`~p2pinfer.engines.slot_loop.SlotJob.reply_tail`); None when not cached."""
    reply_tokens: tuple[int, ...] = ()
    """The tokens that span holds, to insert after the prompt."""
    reply_s: float = 0.0
    """Time the job's own reply work took: re-tokenising, evaluating the reply
    and its end of turn again, saving the span (other slots' steps in between excluded)."""
    reply_note: str | None = None
    """Why the reply was not cached, or was cached only in part (for the logs)."""
    reply_failed: bool = False
    """Saving the reply failed (``reply_note`` says why): the engine logs and counts it."""
    reply_dropped: bool = False
    """The reply's save was given up before it ran, because a request needed its slot."""


@dataclass(frozen=True, slots=True)
class Failed:
    """llama.cpp failed this job; it left its slot."""

    message: str


Event = Union[Restored, Prefilled, TokenChunk, SavingReply, Finished, Failed]
