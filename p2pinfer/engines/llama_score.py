"""Scoring a token sequence with llama.cpp (answer verification), one chunk at a time.

:func:`score_chunk` evaluates one prompt chunk of a check's sequence, asking
llama.cpp for the logits of every row that predicts a token of
``tokens[start:]``, and reduces each row at once to a
:class:`~p2pinfer.engines.base.PositionScore` (the vocabulary's logits never
leave the loop thread). The slot loop runs a check as a job of its own
(:class:`~p2pinfer.engines.slot_loop.ScoreJob`): the cached prefix of the
prompt restored into its sequence, then the rest in the runtime's chunks
(:meth:`~.llama_runtime.LlamaRuntime.chunks`), one per loop iteration,
so each token's KV is computed as when a prompt is served here.
:func:`score_tokens` does the same cold and in one go (no slot loop).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import llama_cpp as _ll

from .base import PositionScore

__all__ = ["score_chunk", "score_tokens"]


def _row_score(logits: Any, token: int, temperature: float) -> PositionScore:
    import numpy as np  # noqa: PLC0415 - a dependency of llama-cpp-python

    z = logits.astype(np.float64) / temperature
    best = int(z.argmax())
    peak = float(z[best])
    e = np.exp(z - peak)
    total = float(e.sum())
    norm = peak + float(np.log(total))
    logp = z - norm
    p = e / total
    mean = float((p * logp).sum())
    var = float((p * (logp - mean) ** 2).sum())
    return PositionScore(token, float(logp[token]), best, float(logp[best]), mean, var)


def score_chunk(
    rt: Any, tokens: Sequence[int], start: int, temperature: float, off: int, size: int, *, seq: int
) -> list[PositionScore]:
    """Evaluate ``tokens[off:off + size]`` at positions ``off...`` of ``seq``
    (``rt``: a :class:`~.llama_runtime.LlamaRuntime`; the positions before
    ``off`` must be in the sequence already) and return the scores of the
    tokens of ``tokens[start:]`` that its rows predict, in order."""
    import numpy as np  # noqa: PLC0415

    n = len(tokens)
    first_row = max(0, start - 1 - off)  # the logits of position i-1 predict token i
    rt.eval_chunk(tokens[off : off + size], off, seq, logits_from=min(first_row, size - 1))
    out: list[PositionScore] = []
    for j in range(first_row, size):
        pos = off + j
        if pos >= n - 1:
            break
        ptr = _ll.llama_get_logits_ith(rt.ctx, j)
        logits = np.ctypeslib.as_array(ptr, shape=(rt.n_vocab,))
        out.append(_row_score(logits, tokens[pos + 1], temperature))
    return out


def score_tokens(
    rt: Any,
    tokens: Sequence[int],
    start: int,
    temperature: float,
    *,
    seq: int = 0,
    cancel: threading.Event | None = None,
) -> list[PositionScore]:
    """Scores of ``tokens[start:]``, evaluating ``tokens`` cold from position 0
    in one go (the engine runs checks through the slot loop instead).

    Cuts the sequence into batches as the runtime's prefill does. Sequence
    ``seq`` is emptied before and after; the caller must own the context.
    """
    from .llama_runtime import JobCancelled  # noqa: PLC0415

    rt.clear_seq(seq)
    out: list[PositionScore] = []
    try:
        for off, size in rt.chunks(len(tokens)):
            if cancel is not None and cancel.is_set():
                raise JobCancelled()
            out += score_chunk(rt, tokens, start, temperature, off, size, seq=seq)
    finally:
        rt.clear_seq(seq)
    return out
