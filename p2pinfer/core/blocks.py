"""Chained block hashes: the vocabulary in which peers describe their caches.

A token sequence is cut into blocks of ``block_size`` tokens; a trailing
partial block is never hashed (it cannot be advertised, it is too cheap to be
worth routing for). Each block's hash commits to every block before it, so a
single 64-bit value names a whole prefix and two peers that hold the same
hash hold the same prefix.

The chain is seeded by the :class:`ModelFingerprint`, so peers that run a
different model, tokenizer, chat template or block size never match. With a
swarm secret the chain is a keyed BLAKE3 (a PRF): whoever reads the digests
without the secret cannot test whether a known prompt is cached. Without a
secret it is XXH3-64 (about 4x faster), which hides nothing and is meant for
public swarms.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
import hashlib
import struct

import blake3
import xxhash

__all__ = ["DEFAULT_BLOCK_SIZE", "BlockHasher", "ModelFingerprint"]

DEFAULT_BLOCK_SIZE = 16
_U32_MAX = 0xFFFFFFFF
_PACK_U64 = struct.Struct("<Q")


@dataclass(frozen=True, slots=True)
class ModelFingerprint:
    """What must be identical for two peers' caches to be interchangeable."""

    model: str
    """Identity of the weights: file digest or a published model id."""
    tokenizer: str
    """Digest of the vocabulary and tokenizer settings."""
    chat_template: str
    """Digest of the chat template (empty when the model has none)."""
    block_size: int = DEFAULT_BLOCK_SIZE

    def __post_init__(self) -> None:
        if not 1 <= self.block_size <= 4096:
            raise ValueError("block_size must be in 1..4096")

    def digest(self) -> bytes:
        """32 bytes naming this fingerprint; stable across processes."""
        text = "\x1f".join(
            ["p2pinfer-fp-v1", self.model, self.tokenizer, self.chat_template, str(self.block_size)]
        )
        return hashlib.sha256(text.encode()).digest()

    def hex(self, length: int = 16) -> str:
        """Short printable id, used in gossip topic names and logs."""
        return self.digest().hex()[:length]


class BlockHasher:
    """Turns token ids into the chained block hashes of their full blocks."""

    __slots__ = ("block_size", "fingerprint", "keyed", "_seed", "_key")

    def __init__(self, fingerprint: ModelFingerprint, secret: bytes | None = None) -> None:
        self.fingerprint = fingerprint
        self.block_size = fingerprint.block_size
        fp = fingerprint.digest()
        self.keyed = bool(secret)
        if secret:
            self._key: bytes | None = blake3.blake3(
                fp + secret, derive_key_context="p2pinfer 2026 block hash key v1"
            ).digest()
        else:
            self._key = None
        self._seed = int.from_bytes(fp[:8], "little")

    def hashes(self, tokens: Sequence[int], limit_blocks: int | None = None) -> list[int]:
        """Chained hashes of the full blocks of ``tokens``, first block first.

        Raises ``ValueError`` for a token id outside 0..2**32-1.
        """
        bs = self.block_size
        n_blocks = len(tokens) // bs
        if limit_blocks is not None:
            n_blocks = min(n_blocks, limit_blocks)
        if n_blocks == 0:
            return []
        try:
            raw = array("I", tokens[: n_blocks * bs]).tobytes()
        except OverflowError as exc:
            raise ValueError("token ids must be in 0..2**32-1") from exc
        view = memoryview(raw)
        step = bs * 4
        out: list[int] = []
        append = out.append
        if self._key is None:
            h = self._seed
            hash64 = xxhash.xxh3_64_intdigest
            for off in range(0, n_blocks * step, step):
                h = hash64(view[off : off + step], seed=h)
                append(h)
        else:
            key = self._key
            prev = _PACK_U64.pack(self._seed)
            b3 = blake3.blake3
            for off in range(0, n_blocks * step, step):
                prev = b3(prev + view[off : off + step], key=key).digest(8)
                append(int.from_bytes(prev, "little"))
        return out

    def blocks_covered(self, n_tokens: int) -> int:
        """Number of full blocks in a prefix of ``n_tokens`` tokens."""
        return n_tokens // self.block_size
