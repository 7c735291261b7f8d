"""JSONL traces: replay your own traffic in the simulator.

Format ``p2pinfer-trace`` version 1, UTF-8, one JSON object per line:

* optional first line, the header:
  ``{"format": "p2pinfer-trace", "version": 1, "tokenizer": "smollm2-gguf"}``
  (``tokenizer`` names what ``tokens`` were cut with; other keys are kept
  as notes);
* then one line per request, in arrival order:

  ============== ======== =====================================================
  key            required meaning
  ============== ======== =====================================================
  ``t``          yes      arrival, seconds from the start (number >= 0,
                          never decreasing)
  ``tokens``     one of   prompt token ids (list of ints in 0..2**32-1)
  ``text``       one of   prompt text: a string, or a list of strings that are
                          tokenised one by one and concatenated (keep shared
                          prefixes as separate parts so they tokenise alike)
  ``output_tokens`` no    tokens to generate (int >= 1, default 16)
  ``label``      no       what the request is about (string, default ``""``)
  ``entry``      no       index of the node it arrives at (int >= 0, taken
                          modulo the node count; default: a random node)
  ============== ======== =====================================================

Blank lines are ignored. Anything else is a :class:`TraceError` that names
the file and line.
"""

from __future__ import annotations

from collections.abc import Iterable
import json
import math
from pathlib import Path
from typing import Any

from .base import Prompt, TimedRequest

__all__ = ["TRACE_FORMAT", "TRACE_VERSION", "TraceError", "read_trace", "write_trace"]

TRACE_FORMAT = "p2pinfer-trace"
TRACE_VERSION = 1
MAX_TRACE_LINE = 16 * 1024 * 1024
_KEYS = {"t", "tokens", "text", "output_tokens", "label", "entry"}


class TraceError(ValueError):
    """A trace line that does not follow the format."""


def _request(obj: Any, where: str, last_t: float) -> TimedRequest:
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: a request must be a JSON object")
    unknown = set(obj) - _KEYS
    if unknown:
        raise TraceError(f"{where}: unknown keys {sorted(unknown)}")
    t = obj.get("t")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
        raise TraceError(f"{where}: 't' must be a number >= 0")
    if t < last_t:
        raise TraceError(f"{where}: 't' goes back in time ({t} < {last_t})")
    has_tokens, has_text = "tokens" in obj, "text" in obj
    if has_tokens == has_text:
        raise TraceError(f"{where}: give exactly one of 'tokens' and 'text'")
    tokens: tuple[int, ...] | None = None
    parts: tuple[str, ...] = ()
    if has_tokens:
        raw = obj["tokens"]
        if (
            not isinstance(raw, list)
            or not raw
            or not all(type(x) is int and 0 <= x < 1 << 32 for x in raw)
        ):
            raise TraceError(f"{where}: 'tokens' must be a non-empty list of ints in 0..2**32-1")
        tokens = tuple(raw)
    else:
        raw = obj["text"]
        if isinstance(raw, str):
            raw = [raw]
        if not isinstance(raw, list) or not raw or not all(isinstance(x, str) and x for x in raw):
            raise TraceError(f"{where}: 'text' must be a non-empty string or list of non-empty strings")
        parts = tuple(raw)
    out = obj.get("output_tokens", 16)
    if type(out) is not int or not 1 <= out <= 1 << 20:
        raise TraceError(f"{where}: 'output_tokens' must be an int >= 1")
    label = obj.get("label", "")
    if not isinstance(label, str):
        raise TraceError(f"{where}: 'label' must be a string")
    entry = obj.get("entry")
    if entry is not None and (type(entry) is not int or entry < 0):
        raise TraceError(f"{where}: 'entry' must be an int >= 0")
    return TimedRequest(float(t), Prompt(label, parts, tokens, out), entry)


def read_trace(path: str | Path) -> tuple[dict[str, Any], list[TimedRequest]]:
    """Parse a trace file: its header (``{}`` when absent) and its requests."""
    path = Path(path)
    header: dict[str, Any] = {}
    requests: list[TimedRequest] = []
    last_t = 0.0
    with path.open("r", encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            where = f"{path}:{number}"
            if len(line) > MAX_TRACE_LINE:
                raise TraceError(f"{where}: line longer than {MAX_TRACE_LINE} characters")
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceError(f"{where}: not JSON ({exc.msg})") from None
            if isinstance(obj, dict) and "format" in obj:
                if requests or header:
                    raise TraceError(f"{where}: the header must be the first line")
                if obj.get("format") != TRACE_FORMAT or obj.get("version") != TRACE_VERSION:
                    raise TraceError(f"{where}: expected format {TRACE_FORMAT!r} version {TRACE_VERSION}")
                header = obj
                continue
            request = _request(obj, where, last_t)
            last_t = request.t
            requests.append(request)
    if not requests:
        raise TraceError(f"{path}: no requests")
    return header, requests


def write_trace(path: str | Path, requests: Iterable[TimedRequest], **notes: Any) -> int:
    """Write a trace (header first); returns the number of requests written."""
    n = 0
    with Path(path).open("w", encoding="utf-8") as f:
        f.write(json.dumps({"format": TRACE_FORMAT, "version": TRACE_VERSION, **notes}) + "\n")
        for r in requests:
            obj: dict[str, Any] = {"t": r.t}
            if r.prompt.tokens is not None:
                obj["tokens"] = list(r.prompt.tokens)
            else:
                obj["text"] = list(r.prompt.parts)
            obj["output_tokens"] = r.prompt.output_tokens
            if r.prompt.label:
                obj["label"] = r.prompt.label
            if r.entry is not None:
                obj["entry"] = r.entry
            f.write(json.dumps(obj, ensure_ascii=False) + "\n")
            n += 1
    return n
