"""Scoring a token sequence with llama.cpp in one prefill (answer verification).

:func:`score_tokens` evaluates ``tokens`` from position 0 in one sequence of
the context, asking llama.cpp for the logits of every row that predicts a
token of ``tokens[start:]``, and reduces each row at once to a
:class:`~p2pinfer.engines.base.PositionScore` (the vocabulary's logits never
leave the worker thread). It has its own batch and touches the context only
through one sequence, which the caller must own and which is left empty:
the engine calls it under its FIFO lock like a request.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import llama_cpp as _ll

from .base import PositionScore

__all__ = ["score_tokens"]


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


def score_tokens(
    rt: Any,
    tokens: Sequence[int],
    start: int,
    temperature: float,
    *,
    seq: int = 0,
    cancel: threading.Event | None = None,
) -> list[PositionScore]:
    """Scores of ``tokens[start:]`` under ``rt``'s model (a :class:`~.llama_runtime.LlamaRuntime`).

    Cuts the sequence into batches as the runtime's prefill does
    (:meth:`~.llama_runtime.LlamaRuntime.chunks`), so each token's KV is
    computed as when the prompt is served here. Sequence ``seq`` is emptied
    before and after.
    """
    import numpy as np  # noqa: PLC0415

    from .llama_runtime import DecodeError, JobCancelled  # noqa: PLC0415

    n = len(tokens)
    first_row = start - 1  # the logits of position i-1 predict token i
    mem = rt.mem
    _ll.llama_memory_seq_rm(mem, seq, -1, -1)
    batch = _ll.llama_batch_init(rt.n_batch, 0, 1)
    out: list[PositionScore] = []
    try:
        for off, size in rt.chunks(n):
            if cancel is not None and cancel.is_set():
                raise JobCancelled()
            batch.n_tokens = size
            rows: list[int] = []
            for j in range(size):
                pos = off + j
                batch.token[j] = tokens[pos]
                batch.pos[j] = pos
                batch.n_seq_id[j] = 1
                batch.seq_id[j][0] = seq
                wanted = first_row <= pos < n - 1
                batch.logits[j] = wanted
                if wanted:
                    rows.append(j)
            rc = _ll.llama_decode(rt.ctx, batch)
            if rc != 0:
                raise DecodeError(f"llama_decode returned {rc} at position {off}")
            for j in rows:
                ptr = _ll.llama_get_logits_ith(rt.ctx, j)
                logits = np.ctypeslib.as_array(ptr, shape=(rt.n_vocab,))
                out.append(_row_score(logits, tokens[off + j + 1], temperature))
    finally:
        _ll.llama_batch_free(batch)
        _ll.llama_memory_seq_rm(mem, seq, -1, -1)
    return out
