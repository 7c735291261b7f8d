"""Cache digests: what a node tells its peers about its prefix cache.

A digest is the set of chained block hashes (see :mod:`p2pinfer.core.blocks`)
that the node's cache holds, with a version number that grows with every
change. It travels as a *full* snapshot or as a *delta* (added and removed
hashes) from one version to the next. The wire form is CBOR (cbor2) with a
schema version, hard size limits, and a strict decoder: anything malformed
raises :class:`DigestError` and nothing else.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
import struct
from typing import Any, Literal

import cbor2

from .blocks import BlockHasher
from .radix import TreeEvent
from .strict_cbor import loads_strict

__all__ = [
    "DIGEST_SCHEMA",
    "MAX_DIGEST_BYTES",
    "MAX_DIGEST_HASHES",
    "Digest",
    "DigestError",
    "DigestTracker",
    "decode_digest",
    "encode_digest",
]

DIGEST_SCHEMA = 1
MAX_DIGEST_HASHES = 1 << 17
"""Most hashes in one message: 131,072 blocks is 2.1 M tokens at block size 16."""
MAX_DIGEST_BYTES = 64 + 16 * 4 + 8 * MAX_DIGEST_HASHES + 4096
"""Upper bound on an encoded digest; checked before any decoding happens."""
MAX_ID_LEN = 128
_U64 = struct.Struct("<Q")


class DigestError(ValueError):
    """A digest could not be decoded or does not follow the schema."""


@dataclass(frozen=True, slots=True)
class Digest:
    """One digest message.

    ``kind == "full"``: ``added`` is the whole set at ``version`` and
    ``removed`` is empty. ``kind == "delta"``: applies on top of ``base``
    (a version) and yields ``version``.
    """

    kind: Literal["full", "delta"]
    node_id: str
    fingerprint: str
    version: int
    base: int = 0
    added: frozenset[int] = field(default_factory=frozenset)
    removed: frozenset[int] = field(default_factory=frozenset)
    epoch: int = 0
    """Random per node start: a restarted node's versions start again at 0."""
    """Random per node start: a restarted node's versions start again at 0."""


    def __post_init__(self) -> None:
        if self.kind not in ("full", "delta"):
            raise DigestError(f"unknown digest kind {self.kind!r}")
        if self.kind == "full" and self.removed:
            raise DigestError("a full digest has no removed hashes")
        if self.kind == "delta" and not self.base < self.version:
            raise DigestError("a delta must go from an older base to a newer version")
        if len(self.added) + len(self.removed) > MAX_DIGEST_HASHES:
            raise DigestError(f"more than {MAX_DIGEST_HASHES} hashes in one digest")


def _pack(hashes: Iterable[int]) -> bytes:
    return b"".join(_U64.pack(h) for h in sorted(hashes))


def _unpack(raw: object, what: str) -> frozenset[int]:
    if not isinstance(raw, bytes):
        raise DigestError(f"{what} must be a byte string")
    if len(raw) % 8:
        raise DigestError(f"{what} length {len(raw)} is not a multiple of 8")
    if len(raw) // 8 > MAX_DIGEST_HASHES:
        raise DigestError(f"{what} holds more than {MAX_DIGEST_HASHES} hashes")
    values = frozenset(h for (h,) in _U64.iter_unpack(raw))
    if len(values) != len(raw) // 8:
        raise DigestError(f"{what} repeats a hash")
    return values


def encode_digest(digest: Digest) -> bytes:
    doc = {
        "s": DIGEST_SCHEMA,
        "k": digest.kind,
        "n": digest.node_id,
        "f": digest.fingerprint,
        "v": digest.version,
        "b": digest.base,
        "a": _pack(digest.added),
        "r": _pack(digest.removed),
        "e": digest.epoch,
    }
    return cbor2.dumps(doc)


def _int_field(doc: dict[str, Any], key: str, what: str) -> int:
    value = doc.get(key)
    if type(value) is not int or not 0 <= value < 1 << 63:
        raise DigestError(f"{what} must be an integer in 0..2**63-1")
    return value


def _str_field(doc: dict[str, Any], key: str, what: str) -> str:
    value = doc.get(key)
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ID_LEN:
        raise DigestError(f"{what} must be a string of 1..{MAX_ID_LEN} characters")
    return value


def decode_digest(data: bytes) -> Digest:
    """Parse and validate one encoded digest; raises :class:`DigestError` only."""
    doc = loads_strict(data, what="digest", max_bytes=MAX_DIGEST_BYTES, max_depth=4, error=DigestError)
    if not isinstance(doc, dict):
        raise DigestError("a digest must be a CBOR map")
    expected = {"s", "k", "n", "f", "v", "b", "a", "r", "e"}
    if set(doc) != expected:
        raise DigestError(f"digest keys must be exactly {sorted(expected)}")
    if doc["s"] != DIGEST_SCHEMA or type(doc["s"]) is not int:
        raise DigestError(f"unsupported digest schema {doc['s']!r} (this node speaks {DIGEST_SCHEMA})")
    kind = doc["k"]
    if kind not in ("full", "delta"):
        raise DigestError(f"unknown digest kind {kind!r}")
    added = _unpack(doc["a"], "added hashes")
    removed = _unpack(doc["r"], "removed hashes")
    return Digest(
        kind=kind,
        node_id=_str_field(doc, "n", "node id"),
        fingerprint=_str_field(doc, "f", "fingerprint"),
        version=_int_field(doc, "v", "version"),
        base=_int_field(doc, "b", "base version"),
        added=added,
        removed=removed,
        epoch=_int_field(doc, "e", "epoch"),
    )


class DigestTracker:
    """Follows a :class:`~p2pinfer.core.radix.RadixTree` and keeps its digest.

    Subscribe :meth:`on_event` to the tree. :meth:`full` gives the current
    snapshot; :meth:`take_delta` gives what changed since the last delta or
    full snapshot and advances the version, or ``None`` when nothing did.

    The digest also lists the blocks of prompts the node has accepted and
    not finished (:meth:`add_in_service`): the engine serves one request at
    a time, first come first served, so a request queued behind one of
    them finds that prefix cached. Without it, two requests for a new
    prefix that arrive a few seconds apart both compute it cold on two
    nodes (live swarm, docs/results.md, issue 7).
    """

    def __init__(self, hasher: BlockHasher, node_id: str, epoch: int = 0) -> None:
        self.hasher = hasher
        self.node_id = node_id
        self.epoch = epoch
        self.fingerprint = hasher.fingerprint.hex()
        self.version = 0
        self._held: set[int] = set()
        """What the digest lists: cached or in service."""
        self._cached: set[int] = set()
        self._in_service: Counter[int] = Counter()
        self._added: set[int] = set()
        self._removed: set[int] = set()
        self._listeners: list[Callable[[int, bool], None]] = []

    @property
    def hashes(self) -> frozenset[int]:
        return frozenset(self._held)

    def __len__(self) -> int:
        return len(self._held)

    def subscribe(self, listener: Callable[[int, bool], None]) -> None:
        """Call ``listener(hash, listed)`` whenever a hash enters or leaves the digest."""
        self._listeners.append(listener)

    def unsubscribe(self, listener: Callable[[int, bool], None]) -> None:
        self._listeners.remove(listener)

    def _list(self, h: int) -> None:
        if h not in self._held:
            self._held.add(h)
            if h in self._removed:
                self._removed.discard(h)
            else:
                self._added.add(h)
            for listener in self._listeners:
                listener(h, True)

    def _unlist(self, h: int) -> None:
        if h in self._held:
            self._held.discard(h)
            if h in self._added:
                self._added.discard(h)
            else:
                self._removed.add(h)
            for listener in self._listeners:
                listener(h, False)

    def on_event(self, event: TreeEvent) -> None:
        bs = self.hasher.block_size
        first = event.start // bs  # first block whose end lies past start
        chain = self.hasher.hashes(event.path)
        changed = chain[first:]
        if event.kind == "insert":
            for h in changed:
                self._cached.add(h)
                self._list(h)
        else:
            for h in changed:
                self._cached.discard(h)
                if h not in self._in_service:
                    self._unlist(h)

    def add_in_service(self, hashes: Sequence[int]) -> None:
        """A prompt (its chained block hashes) was accepted for serving here."""
        for h in hashes:
            self._in_service[h] += 1
            self._list(h)

    def remove_in_service(self, hashes: Sequence[int]) -> None:
        """That prompt finished or failed; its blocks stay listed if cached."""
        for h in hashes:
            n = self._in_service[h] - 1
            if n > 0:
                self._in_service[h] = n
                continue
            del self._in_service[h]
            if h not in self._cached:
                self._unlist(h)

    def in_service_blocks(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of ``hashes`` a prompt in service covers."""
        n = 0
        for h in hashes:
            if h not in self._in_service:
                break
            n += 1
        return n

    def on_event_insert(self, path: tuple[int, ...]) -> None:
        """Count an already cached sequence (an engine that starts warm)."""
        self.on_event(TreeEvent("insert", tuple(path), 0))

    @property
    def pending(self) -> int:
        """Hashes changed since the last published version."""
        return len(self._added) + len(self._removed)

    def full(self) -> Digest:
        """Snapshot at the current version (pending changes are folded in)."""
        if self.pending:
            self.version += 1
            self._added.clear()
            self._removed.clear()
        return Digest("full", self.node_id, self.fingerprint, self.version, 0, frozenset(self._held), epoch=self.epoch)

    def take_delta(self) -> Digest | None:
        """The changes since the last published version, or ``None``.

        When the changes would not fit one message, a full digest is
        returned instead (receivers accept either).
        """
        if not self.pending:
            return None
        if self.pending > MAX_DIGEST_HASHES // 2:
            return self.full()
        base = self.version
        self.version += 1
        delta = Digest(
            "delta",
            self.node_id,
            self.fingerprint,
            self.version,
            base,
            frozenset(self._added),
            frozenset(self._removed),
            epoch=self.epoch,
        )
        self._added.clear()
        self._removed.clear()
        return delta
