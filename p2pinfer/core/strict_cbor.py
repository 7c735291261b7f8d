"""Strict CBOR decoding for everything a peer sends (digests, directory messages).

One place for the rules: bytes only, a size limit checked before parsing,
a depth limit, no indefinite lengths, no duplicate keys and no tags at all
(cbor2 decodes well-known tags such as dates and sets before ``tag_hook``
sees them, so every 16-bit tag is mapped to a rejecting decoder). Any
failure becomes the caller's own error type with a precise message.
"""

from __future__ import annotations

from typing import Any

import cbor2

__all__ = ["loads_strict"]


def _reject_tag(*_: Any) -> Any:
    raise ValueError("CBOR tags are not allowed")  # cbor2 reports it as an error decoding that tag


_NO_SEMANTIC_TAGS: dict[int, Any] | None = None


def _no_semantic_tags() -> dict[int, Any]:
    global _NO_SEMANTIC_TAGS
    if _NO_SEMANTIC_TAGS is None:
        _NO_SEMANTIC_TAGS = dict.fromkeys(range(1 << 16), _reject_tag)
    return _NO_SEMANTIC_TAGS


def loads_strict(data: object, *, what: str, max_bytes: int, max_depth: int, error: type[Exception]) -> Any:
    """Decode ``data`` (a ``what``: "digest", "directory message") or raise ``error``."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise error(f"a {what} must be bytes")
    if len(data) > max_bytes:
        raise error(f"{what} of {len(data)} bytes exceeds {max_bytes}")
    try:
        return cbor2.loads(
            bytes(data),
            tag_hook=_reject_tag,
            semantic_decoders=_no_semantic_tags(),
            max_depth=max_depth,
            allow_indefinite=False,
            allow_duplicate_keys=False,
        )
    except Exception as exc:  # cbor2 raises many types on garbage
        raise error(f"not valid CBOR: {exc}") from None
