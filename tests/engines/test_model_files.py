from __future__ import annotations

from pathlib import Path

import pytest

from p2pinfer.engines.model_files import (
    DEFAULT_GGUF,
    ModelFileError,
    default_model_path,
    file_identity,
    resolve_model_path,
)


def test_default_model_is_found_in_the_installed_package() -> None:
    path = default_model_path()
    assert path.name == DEFAULT_GGUF and path.read_bytes()[:4] == b"GGUF"
    assert resolve_model_path(None) == path


def test_missing_model_file_gets_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="model file not found"):
        resolve_model_path(tmp_path / "nope.gguf")


def test_identity_follows_content_not_name(tmp_path: Path) -> None:
    data = bytearray(b"GGUF" + bytes(range(256)) * 40_000)  # about 10 MiB
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    a.write_bytes(data)
    b.write_bytes(data)
    assert file_identity(a) == file_identity(b)
    data[100] ^= 1  # the header
    b.write_bytes(data)
    assert file_identity(a) != file_identity(b)
    data[100] ^= 1
    data[-1] ^= 1  # the last sampled block of weights
    b.write_bytes(data)
    assert file_identity(a) != file_identity(b)
    b.write_bytes(bytes(data) + b"x")  # the size
    assert file_identity(a) != file_identity(b)
