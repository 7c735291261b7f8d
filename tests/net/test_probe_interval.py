"""The RTT probe schedule (``net/membership.py`` ``next_probe_interval``)."""

from __future__ import annotations

from p2pinfer.net.membership import next_probe_interval

SHORT, LONGEST = 2.0, 30.0


def test_stable_samples_back_off_to_the_longest_interval():
    interval = SHORT
    for _ in range(10):
        interval = next_probe_interval(interval, 1.2, 1.0, SHORT, LONGEST)
    assert interval == LONGEST


def test_a_jittery_sample_halves_the_interval_instead_of_restarting_it():
    assert next_probe_interval(LONGEST, 40.0, 1.0, SHORT, LONGEST) == LONGEST / 2
    assert next_probe_interval(3.0, 40.0, 1.0, SHORT, LONGEST) == SHORT
    assert next_probe_interval(16.0, None, 1.0, SHORT, LONGEST) == 8.0  # a failed probe


def test_jitter_on_every_other_sample_keeps_the_peer_off_the_shortest_interval():
    """What a loaded machine's loopback did: half the samples off by more than 10 ms."""
    interval, seen = LONGEST, []
    for i in range(40):
        interval = next_probe_interval(interval, 25.0 if i % 2 else 1.0, 1.0, SHORT, LONGEST)
        seen.append(interval)
    assert min(seen[10:]) > SHORT
