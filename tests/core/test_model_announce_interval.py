"""How often a node announces its model: flat per node, not per swarm (issue 14)."""

from __future__ import annotations

from p2pinfer.core.swarm_models import FLAT_NODES, MAX_INTERVAL_FACTOR, SwarmModels, announce_interval_s


def test_the_interval_grows_with_the_swarm_past_eight_nodes_so_each_node_hears_the_same_rate():
    base = 60.0
    assert announce_interval_s(base, 2) == announce_interval_s(base, FLAT_NODES) == base
    rates = [n / announce_interval_s(base, n) for n in (8, 16, 32, 64)]
    assert max(rates) == min(rates)  # announcements a node receives per second
    assert announce_interval_s(base, 10_000) == MAX_INTERVAL_FACTOR * base


def test_the_table_announces_and_expires_on_the_swarms_interval():
    t = SwarmModels("self", "aaaa", "own", base_interval_s=60.0)
    assert t.interval_s == 60.0 and t.ttl_s == 150.0
    for i in range(15):
        t.heard(f"p{i}", "bbbb", "other", 0.0)
    assert t.interval_s == 120.0 and t.ttl_s == 300.0  # 16 nodes, this one included
    # A peer heard 200 s ago still counts at 16 nodes (it announces every 120 s here) ...
    assert "p0" in t.serving("bbbb", 200.0)
    # ... and a model outlives its TTL in memory (a 503, not a 404, while no node serves it).
    assert t.remember_s >= 2 * t.ttl_s
    assert t.serving("bbbb", 301.0) == [] and t.resolve("other", 301.0) == "bbbb"
