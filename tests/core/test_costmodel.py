"""EngineCostModel's batched decode step and prompt chunks (issue 18)."""

from __future__ import annotations

import pytest

from p2pinfer.core.costmodel import BATCH_DECODE_TOKENS_PER_S, PREFILL_CHUNK_TOKENS, EngineCostModel, chunk_cuts


def test_decode_step_follows_the_measured_batch_curve() -> None:
    cost = EngineCostModel()
    tps = dict(BATCH_DECODE_TOKENS_PER_S)
    assert cost.decode_step_ms(1) == pytest.approx(cost.decode_ms_per_token)
    for k in (2, 4, 8):
        # k sequences in one step take k / tps(k) seconds where one takes 1 / tps(1).
        assert cost.decode_step_ms(k) == pytest.approx(cost.decode_ms_per_token * k * tps[1] / tps[k])
    assert [round(cost.decode_step_ms(k) / cost.decode_ms_per_token, 2) for k in (2, 4, 8)] == [1.48, 2.68, 4.91]


def test_decode_step_interpolates_and_holds_the_last_rate_beyond_it() -> None:
    cost = EngineCostModel()
    s2, s3, s4 = cost.decode_step_ms(2), cost.decode_step_ms(3), cost.decode_step_ms(4)
    assert s3 == pytest.approx((s2 + s4) / 2)
    steps = [cost.decode_step_ms(k) for k in range(1, 20)]
    assert steps == sorted(steps)  # more sequences never make a step cheaper
    per_seq_8 = cost.decode_step_ms(8) / 8
    assert cost.decode_step_ms(16) / 16 == pytest.approx(per_seq_8)
    assert cost.decode_step_ms(0) == 0.0
    # Batching is a gain: k sequences in one step cost less than k single steps.
    assert all(cost.decode_step_ms(k) < k * cost.decode_ms_per_token for k in range(2, 20))


def test_scaled_keeps_the_curve_relative() -> None:
    cost = EngineCostModel()
    half = cost.scaled(0.5)
    for k in (1, 3, 4, 8, 12):
        assert half.decode_step_ms(k) == pytest.approx(cost.decode_step_ms(k) / 2)
    assert cost.scaled(0).decode_step_ms(4) == 0.0
    assert cost.scaled(1.0) is cost  # its source unchanged: what the benchmarks' JSON records at full speed


def test_a_curve_without_one_sequence_is_refused() -> None:
    with pytest.raises(ValueError):
        EngineCostModel(batch_decode_tokens_per_s=((2, 40.0), (4, 50.0)))
    with pytest.raises(ValueError):
        EngineCostModel(batch_decode_tokens_per_s=((1, 40.0), (2, 0.0)))


def test_chunk_cuts_cover_the_prompt_without_a_lone_last_token() -> None:
    assert PREFILL_CHUNK_TOKENS == 128
    assert chunk_cuts(300) == [(0, 128), (128, 128), (256, 44)]
    assert chunk_cuts(257) == [(0, 128), (128, 127), (255, 2)]
    assert chunk_cuts(1) == [(0, 1)]
    assert chunk_cuts(0) == []
    for n in range(1, 600):
        cuts = chunk_cuts(n)
        assert sum(size for _, size in cuts) == n
        assert all(off == sum(s for _, s in cuts[:i]) for i, (off, _) in enumerate(cuts))
        assert len(cuts) == 1 or cuts[-1][1] > 1
