from __future__ import annotations

from hypothesis import given, strategies as st
import pytest

from p2pinfer.core import BlockHasher, ModelFingerprint

FP = ModelFingerprint("model-a", "tok-a", "tpl-a")
tokens = st.lists(st.integers(0, 50_000), max_size=200)


@given(tokens)
def test_only_full_blocks_are_hashed(toks: list[int]) -> None:
    assert len(BlockHasher(FP).hashes(toks)) == len(toks) // 16


@given(tokens, tokens)
def test_chain_commits_to_every_earlier_block(a: list[int], b: list[int]) -> None:
    ha, hb = BlockHasher(FP).hashes(a), BlockHasher(FP).hashes(b)
    for i in range(min(len(ha), len(hb))):
        same_prefix = a[: 16 * (i + 1)] == b[: 16 * (i + 1)]
        assert (ha[i] == hb[i]) == same_prefix


def test_block_hash_depends_on_previous_blocks() -> None:
    x = list(range(16))
    y = [7] * 16
    h1 = BlockHasher(FP).hashes(x + y)
    h2 = BlockHasher(FP).hashes(y + y)
    assert h1[1] != h2[1]  # same second block, different history


@pytest.mark.parametrize(
    "other",
    [
        ModelFingerprint("model-b", "tok-a", "tpl-a"),
        ModelFingerprint("model-a", "tok-b", "tpl-a"),
        ModelFingerprint("model-a", "tok-a", "tpl-b"),
    ],
)
def test_other_model_never_matches(other: ModelFingerprint) -> None:
    toks = list(range(64))
    assert set(BlockHasher(FP).hashes(toks)).isdisjoint(BlockHasher(other).hashes(toks))


def test_block_size_is_part_of_the_fingerprint() -> None:
    other = ModelFingerprint("model-a", "tok-a", "tpl-a", block_size=32)
    assert other.digest() != FP.digest()
    assert len(BlockHasher(other).hashes(list(range(64)))) == 2


def test_secret_keys_the_hashes() -> None:
    toks = list(range(64))
    public = BlockHasher(FP).hashes(toks)
    keyed_a = BlockHasher(FP, b"swarm secret A").hashes(toks)
    keyed_a2 = BlockHasher(FP, b"swarm secret A").hashes(toks)
    keyed_b = BlockHasher(FP, b"swarm secret B").hashes(toks)
    assert keyed_a == keyed_a2
    # Without the secret, hashing a known prompt gives nothing that matches.
    assert set(keyed_a).isdisjoint(public)
    assert set(keyed_a).isdisjoint(keyed_b)


def test_invalid_token_ids_raise_value_error() -> None:
    with pytest.raises(ValueError):
        BlockHasher(FP).hashes([-1] * 16)
    with pytest.raises(ValueError):
        BlockHasher(FP).hashes([2**32] * 16)


def test_fingerprint_is_stable_text() -> None:
    assert FP.hex() == ModelFingerprint("model-a", "tok-a", "tpl-a").hex()
    assert len(FP.hex()) == 16
