"""What a FIFO engine will have cached when a queued request starts."""

from __future__ import annotations

from hypothesis import given, strategies as st

from p2pinfer.engines.prompts_ahead import PromptsAhead, shared_prefix_len

tokens = st.lists(st.integers(0, 3), max_size=40)


@given(tokens, tokens)
def test_shared_prefix_len_is_the_first_mismatch(a: list[int], b: list[int]) -> None:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    assert shared_prefix_len(a, b) == n == shared_prefix_len(tuple(b), a)


def test_prompts_ahead_covers_by_the_longest_and_forgets_by_identity() -> None:
    ahead = PromptsAhead()
    one, two, same_as_two = [1, 2, 3, 4], [1, 2, 9], [1, 2, 9]
    assert ahead.covered([1, 2, 3]) == 0
    ahead.add(one)
    ahead.add(two)
    ahead.add(same_as_two)
    assert ahead.covered([1, 2, 3, 4, 5]) == 4 and ahead.covered([1, 2, 9, 9]) == 3
    ahead.remove(one)
    assert ahead.covered([1, 2, 3, 4, 5]) == 2
    ahead.remove(two)
    assert len(ahead) == 1 and ahead.covered([1, 2, 9]) == 3  # the equal one is still queued
