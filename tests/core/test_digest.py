from __future__ import annotations

import tracemalloc

import cbor2
from hypothesis import given, settings, strategies as st
import pytest

from p2pinfer.core import Digest, DigestError, decode_digest, encode_digest
from p2pinfer.core.digest import MAX_DIGEST_BYTES, MAX_DIGEST_HASHES

hash_sets = st.frozensets(st.integers(0, 2**64 - 1), max_size=200)


@given(hash_sets, st.integers(0, 2**40), st.integers(0, 2**62))
def test_full_round_trip(hashes: frozenset[int], version: int, epoch: int) -> None:
    d = Digest("full", "node-1", "abcd", version, 0, hashes, epoch=epoch)
    assert decode_digest(encode_digest(d)) == d


@given(hash_sets, hash_sets, st.integers(0, 2**40))
def test_delta_round_trip(added: frozenset[int], removed: frozenset[int], base: int) -> None:
    d = Digest("delta", "node-1", "abcd", base + 1, base, added, removed - added)
    assert decode_digest(encode_digest(d)) == d


@settings(max_examples=2000)
@given(st.binary(max_size=512))
def test_garbage_raises_only_digest_error(data: bytes) -> None:
    try:
        decode_digest(data)
    except DigestError:
        pass


VALID = {"s": 1, "k": "full", "n": "n", "f": "f", "v": 1, "b": 0, "a": b"", "r": b"", "e": 0}


@pytest.mark.parametrize(
    "doc",
    [
        [1, 2, 3],
        {**VALID, "s": 2},
        {**VALID, "k": "other"},
        {**VALID, "v": -1},
        {**VALID, "v": "1"},
        {**VALID, "n": ""},
        {**VALID, "n": "x" * 1000},
        {**VALID, "a": b"1234567"},
        {**VALID, "a": b"\0" * 16},  # repeated hash
        {**VALID, "r": b"\1" * 8},  # a full digest removes nothing
        {**VALID, "k": "delta", "v": 1, "b": 1},  # delta must move forward
        {**VALID, "extra": 1},
        {k: v for k, v in VALID.items() if k != "e"},
        {**VALID, "a": cbor2.CBORTag(35, "a+")},  # tags (regex!) are refused
        {**VALID, "n": cbor2.CBORTag(1, 0)},
    ],
)
def test_schema_violations_are_rejected(doc: object) -> None:
    with pytest.raises(DigestError):
        decode_digest(cbor2.dumps(doc))


def test_oversized_input_rejected_before_decoding() -> None:
    with pytest.raises(DigestError, match="exceeds"):
        decode_digest(b"\xa0" + b"\0" * MAX_DIGEST_BYTES)


def test_declared_huge_length_does_not_allocate() -> None:
    # A byte string header claiming 2**62 bytes, followed by almost nothing.
    evil = b"\xa1\x61a\x5b" + (2**62).to_bytes(8, "big") + b"xx"
    tracemalloc.start()
    with pytest.raises(DigestError):
        decode_digest(evil)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 10_000_000


def test_too_many_hashes_refused_at_construction() -> None:
    with pytest.raises(DigestError):
        Digest("full", "n", "f", 1, 0, frozenset(range(MAX_DIGEST_HASHES + 1)))
