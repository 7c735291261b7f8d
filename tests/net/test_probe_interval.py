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


async def test_probes_back_off_past_the_responders_idle_close(monkeypatch):
    """py-libp2p's ping handler closes a stream idle for RESP_TIMEOUT (10 s;
    1 s here): probes spaced wider than that must not find a closed stream,
    fail, and fall back to short intervals; they reach the longest one."""
    import libp2p.host.ping as ping
    import trio

    from p2pinfer.lab.node_process import fast_config, wait_for
    from p2pinfer.net import membership
    from p2pinfer.node import Node

    monkeypatch.setattr(ping, "RESP_TIMEOUT", 1)
    monkeypatch.setattr(membership, "_PING_STREAM_IDLE_S", 0.8)
    cfg = dict(rtt_interval_s=0.25, rtt_max_interval_s=4.0)
    async with Node(fast_config(**cfg)) as b, Node(fast_config(bootstrap=(b.addrs[0],), **cfg)) as a:
        await a.wait_for_peers(1)
        await wait_for(lambda: b.peer_id in a.membership._probes, 10)
        await wait_for(lambda: a.membership._probes[b.peer_id].interval == 4.0, 20)
        probes = a.counters.rtt_probes
        await trio.sleep(4.5)  # one more probe at the longest interval, on a fresh stream
        assert a.counters.rtt_probes - probes <= 2
        assert a.membership._probes[b.peer_id].interval == 4.0
        assert a.router.view.get(b.peer_id).rtt_ms is not None
