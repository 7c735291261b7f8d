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


async def test_probes_reuse_one_stream_past_libp2ps_idle_close(monkeypatch):
    """py-libp2p's ping handler closes a stream idle for RESP_TIMEOUT (10 s;
    1 s here); our responder keeps it, so probes spaced wider than that go
    over the same stream (no stream opening per probe) and back off to the
    longest interval."""
    import libp2p.host.ping as ping
    import trio

    from p2pinfer.lab.node_process import fast_config, wait_for
    from p2pinfer.node import Node

    monkeypatch.setattr(ping, "RESP_TIMEOUT", 1)
    cfg = dict(rtt_interval_s=0.25, rtt_max_interval_s=2.0)
    async with Node(fast_config(**cfg)) as b, Node(fast_config(bootstrap=(b.addrs[0],), **cfg)) as a:
        await a.wait_for_peers(1)
        await wait_for(lambda: b.peer_id in a.membership._probes, 10)
        await wait_for(lambda: a.membership._probes[b.peer_id].interval == 2.0, 20)
        stream = a.membership._ping_streams[b.peer_id]
        probes = a.counters.rtt_probes
        await trio.sleep(4.5)  # two more probes, each more than RESP_TIMEOUT after the last
        assert a.counters.rtt_probes - probes >= 2
        assert a.membership._ping_streams[b.peer_id] is stream
        assert a.membership._probes[b.peer_id].interval == 2.0


async def test_a_responder_that_closes_idle_streams_is_probed_on_a_new_stream(monkeypatch):
    """A peer answering with py-libp2p's own handler (10 s idle close; 1 s
    here): a probe finding its kept stream closed is retried at once on a new
    one, so the peer is not taken for jittery and probes keep backing off."""
    import libp2p.host.ping as ping
    import trio

    from p2pinfer.lab.node_process import fast_config, wait_for
    from p2pinfer.node import Node

    monkeypatch.setattr(ping, "RESP_TIMEOUT", 1)
    cfg = dict(rtt_interval_s=0.25, rtt_max_interval_s=2.0)
    async with Node(fast_config(**cfg)) as b, Node(fast_config(bootstrap=(b.addrs[0],), **cfg)) as a:
        b.host.set_stream_handler(ping.ID, ping.PingService(b.host).handle_ping)
        await a.wait_for_peers(1)
        await wait_for(lambda: b.peer_id in a.membership._probes, 10)
        await wait_for(lambda: a.membership._probes[b.peer_id].interval == 2.0, 20)
        stream = a.membership._ping_streams[b.peer_id]
        await trio.sleep(4.5)
        assert a.membership._probes[b.peer_id].interval == 2.0
        assert a.membership._ping_streams[b.peer_id] is not stream
        assert a.router.view.get(b.peer_id).rtt_ms is not None


async def test_a_ping_received_counts_as_hearing_from_the_prober():
    """B never probes A and A sends B nothing but probes: A's probes keep it
    in B's view past the TTL, and B sends no liveness probe of its own."""
    import trio

    from p2pinfer.core.router import GossipConfig
    from p2pinfer.lab.node_process import fast_config, wait_for
    from p2pinfer.node import Node

    gossip = GossipConfig(delta_interval_s=0.1, full_interval_s=1.0, load_interval_s=0.25, keepalive_interval_s=0.5, peer_ttl_s=4.0)
    async with Node(fast_config(gossip=gossip, rtt_interval_s=30.0, rtt_max_interval_s=30.0)) as b, Node(
        fast_config(bootstrap=(b.addrs[0],), gossip=gossip, rtt_interval_s=0.25, rtt_max_interval_s=1.0)
    ) as a:
        await a.wait_for_peers(1)
        await wait_for(lambda: a.peer_id in b.router.view, 10)
        await trio.sleep(2.0)  # the keep-alives after the new connection are over
        published, probes = a.counters.gossip_published, b.counters.rtt_probes
        await trio.sleep(6.0)  # more than the TTL
        assert a.counters.gossip_published == published  # A said nothing but its probes
        assert a.peer_id in b.router.view
        assert b.counters.rtt_probes == probes == 0
