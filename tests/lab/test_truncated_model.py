"""The truncated-precision liar's model (lab/wrong_tokens.py ``truncated_model``): the same GGUF with
every Q4_1 weight moved to the middle of its bucket on a coarser grid, everything else byte for byte."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from p2pinfer.engines.model_files import resolve_model_path
from p2pinfer.lab.wrong_tokens import truncated_model


@pytest.mark.parametrize("bits", [2, 3])
def test_truncated_model_keeps_the_top_bits_of_each_weight_and_the_rest_of_the_file(tmp_path: Path, bits: int) -> None:
    source = resolve_model_path(None)
    out = truncated_model(source, bits, cache_dir=tmp_path)
    assert truncated_model(source, bits, cache_dir=tmp_path) == out  # written once, then reused
    src, cut = gguf.GGUFReader(source), gguf.GGUFReader(out)
    assert [t.name for t in src.tensors] == [t.name for t in cut.tensors]
    raw_src, raw_cut = np.fromfile(source, dtype=np.uint8), np.fromfile(out, dtype=np.uint8)
    assert len(raw_src) == len(raw_cut)
    changed = np.zeros(len(raw_src), dtype=bool)
    drop = 4 - bits
    q41 = 0
    for a, b in zip(src.tensors, cut.tensors):
        lo, hi = a.data_offset, a.data_offset + a.n_bytes
        changed[lo:hi] = True
        if a.tensor_type != gguf.GGMLQuantizationType.Q4_1:
            assert np.array_equal(raw_src[lo:hi], raw_cut[lo:hi]), a.name
            continue
        q41 += 1
        old, new = raw_src[lo:hi].reshape(-1, 20), raw_cut[lo:hi].reshape(-1, 20)
        codes = np.concatenate([old[:, 4:] & 0xF, old[:, 4:] >> 4], axis=1)
        kept = np.concatenate([new[:, 4:] & 0xF, new[:, 4:] >> 4], axis=1)
        assert np.array_equal(kept >> drop, codes >> drop)  # the top bits are the weight's own
        assert np.all(kept & ((1 << drop) - 1) == 1 << (drop - 1))  # the low bits, the bucket's middle
        d_old, m_old = (old[:, :4].copy().view(np.float16).reshape(-1, 2).astype(np.float32).T)
        d_new, m_new = (new[:, :4].copy().view(np.float16).reshape(-1, 2).astype(np.float32).T)
        assert np.array_equal(d_new, d_old)
        # w = d * q + m lands at d * (bucket start + (2 ** drop - 1) / 2) + m, within float16 rounding of m.
        w_new = d_new[:, None] * kept + m_new[:, None]
        w_mid = d_old[:, None] * ((codes >> drop << drop) + ((1 << drop) - 1) / 2) + m_old[:, None]
        assert np.allclose(w_new, w_mid, atol=float(np.abs(m_old).max()) * 2**-10 + 1e-6)
    assert q41 > 100
    assert np.array_equal(raw_src[~changed], raw_cut[~changed])  # header and metadata untouched
