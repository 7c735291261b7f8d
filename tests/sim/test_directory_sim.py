"""The simulator with the prefix directory: invariants, the round trip, the bytes."""

from __future__ import annotations

from dataclasses import replace
import json
import os
import subprocess
import sys
from typing import Any

import pytest

from p2pinfer.core.directory import DirectoryConfig
from p2pinfer.core.router import GossipConfig
from p2pinfer.sim import SimConfig, Simulator, without_wall_clock
from p2pinfer.sim.runner import WorkloadSpec, build_requests


def run(config: SimConfig, built: Any) -> tuple[Simulator, dict[str, Any]]:
    reqs, encoder, info = built
    sim = Simulator(config, reqs, encoder, workload=info)
    return sim, sim.run()


@pytest.fixture(scope="module")
def swarm_600() -> Any:
    """600 MMLU arrivals at 0.35 req/s per node for 16 nodes."""
    return build_requests(WorkloadSpec(requests=600), 16, 3)


DIR = SimConfig(nodes=16, discovery="directory", topic_size=4, seed=3)


def test_every_arrival_completes_exactly_once_under_churn_and_loss(swarm_600: Any) -> None:
    config = replace(
        DIR, churn_interval_s=8.0, rejoin_delay_s=2.0, loss=0.2, membership_delay_s=1.0, busy_queue_ms=1500.0,
        gossip=GossipConfig(keepalive_interval_s=1.0, peer_ttl_s=3.0), directory=DirectoryConfig(refresh_s=5.0, entry_ttl_s=12.0),
    )
    sim, result = run(config, swarm_600)
    assert sorted(r.rid for r in sim.completed) == list(range(600))  # each arrival once, none twice
    assert not sim.pending and result["requests"] == 600
    assert result["churn"]["leaves"] >= 5 and result["churn"]["joins"] >= 4
    assert all(r.first_token is not None and r.first_token >= r.arrival for r in sim.completed)
    d = result["discovery"]["directory"]
    assert d["lost"] > 0 and d["query_timeouts"] > 0  # lost queries and dead owners were survived
    assert result["failed_forwards"] + result["client_retries"] + result["orphaned_jobs"] > 0
    assert result["hit_rate"] > 0.3  # it still finds caches


def test_a_timed_out_query_is_asked_again(swarm_600: Any) -> None:
    lossy = replace(DIR, loss=0.2)
    _, once = run(replace(lossy, directory=DirectoryConfig(query_attempts=1)), swarm_600)
    _, twice = run(lossy, swarm_600)
    a, b = once["discovery"]["directory"], twice["discovery"]["directory"]
    assert a["decided_without_answer"] == a["query_timeouts"] > 0
    assert 0 < b["decided_without_answer"] < b["query_timeouts"]
    assert b["decided_without_answer"] < a["decided_without_answer"] / 2
    assert b["messages"]["query"] > a["messages"]["query"]


def test_checksum_refresh_heals_lost_updates_for_fewer_bytes(swarm_600: Any) -> None:
    lossy = replace(DIR, loss=0.1, directory=DirectoryConfig(refresh_s=5.0, refresh="full"))
    _, full = run(lossy, swarm_600)
    _, checked = run(replace(lossy, directory=DirectoryConfig(refresh_s=5.0, refresh="checksum")), swarm_600)
    kinds_full = full["discovery"]["in_bytes_per_node_per_s_by_kind"]
    kinds = checked["discovery"]["in_bytes_per_node_per_s_by_kind"]
    assert checked["discovery"]["directory"]["messages"]["resync"] > 0  # lost updates were found and resent
    # Bytes per refresh sent: how many refreshes a run sends depends on which
    # registrations its losses and timings left, which differs between the two
    # runs by chance (about 10 % at this seed since issue 14's gossip schedule).
    per_refresh = (kinds["directory refresh"] + kinds["directory resync"]) / checked["discovery"]["directory"]["messages"]["refresh"]
    per_refresh_full = kinds_full["directory refresh"] / full["discovery"]["directory"]["messages"]["refresh"]
    # Checksums and the resyncs they trigger came to 0.45 and 0.50 of a full refresh's bytes with the
    # field-note and the measured cost model (the refreshes alone 0.43 and 0.46); the bound is "clearly
    # fewer", not a figure of this seed.
    assert per_refresh < 0.75 * per_refresh_full
    assert checked["hit_rate"] > full["hit_rate"] - 0.02


def test_same_seed_same_result(swarm_600: Any) -> None:
    config = replace(DIR, loss=0.1, churn_interval_s=20.0)
    a = without_wall_clock(run(config, swarm_600)[1])
    b = without_wall_clock(run(config, build_requests(WorkloadSpec(requests=600), 16, 3))[1])
    assert a == b
    c = without_wall_clock(run(replace(config, seed=4), build_requests(WorkloadSpec(requests=600), 16, 4))[1])
    assert c != a


def _cli_json(hash_seed: str) -> dict[str, Any]:
    env = dict(os.environ, PYTHONHASHSEED=hash_seed)
    out = subprocess.run(
        [sys.executable, "-m", "p2pinfer.cli.main", "simulate", "--requests", "300", "--nodes", "12", "--discovery",
         "directory", "--topic-size", "4", "--seed", "3", "--loss", "0.1", "--churn-interval", "20", "--json"],
        capture_output=True, text=True, check=True, env=env,
    )
    return json.loads(out.stdout)


def test_same_seed_same_json_across_processes() -> None:
    a, b = _cli_json("1"), _cli_json("2")
    assert a["params"]["gossip"]["discovery"] == "directory"
    assert without_wall_clock(a) == without_wall_clock(b)


def test_the_directory_finds_holders_no_neighbour_knows(swarm_600: Any) -> None:
    """Topics of one node gossip nothing: what the directory adds is all there is."""
    alone = SimConfig(nodes=16, topic_size=1, seed=3)
    _, blind = run(alone, swarm_600)
    _, found = run(replace(alone, discovery="directory", load_topics="fill"), swarm_600)  # topics of exactly one
    _, oracle = run(replace(alone, policy="oracle"), swarm_600)
    assert blind["gossip_bytes_per_node_per_s"] == 0 and blind["forwarded_share"] == 0
    assert found["hit_rate"] > blind["hit_rate"] + 0.1
    assert found["hit_rate"] > oracle["hit_rate"] - 0.05
    by_kind = found["discovery"]["in_bytes_per_node_per_s_by_kind"]
    assert set(by_kind) == {"directory query", "directory answer", "directory register", "directory refresh"}
    assert found["gossip_bytes_per_node_per_s"] == pytest.approx(sum(by_kind.values()), abs=1.0)


def test_the_lookup_round_trip_is_charged(swarm_600: Any) -> None:
    """At 50 ms per hop a remote lookup delays the decision by exactly 100 ms."""
    config = replace(DIR, latency="50", record_decisions=True)
    sim, result = run(config, swarm_600)
    waits = sorted(set(round(w, 6) for w in sim.lookup_ms))
    assert waits[-1] == pytest.approx(100.0) and set(waits) <= {0.0, 100.0}  # 0: this node owns the anchor
    assert result["decision_wait_ms"]["p50"] == pytest.approx(100.0)
    for r in sim.completed:
        if r.served_by is not r.entry:
            assert r.first_token - r.arrival >= 0.1  # lookup + two hops at least


def test_directory_is_validated() -> None:
    with pytest.raises(ValueError, match="discovery"):
        SimConfig(discovery="dht").validate()
    with pytest.raises(ValueError, match="instant"):
        SimConfig(discovery="directory", instant_gossip=True).validate()
    SimConfig(nodes=4096, discovery="directory").validate()  # no node indexes the whole swarm


def test_kademlia_placement_counts_the_dhts_own_traffic() -> None:
    """With the live node's placement the simulator counts KadDHT's own FIND_NODE
    traffic (p2pinfer/core/dht.py): routing-table refreshes, and per-anchor
    lookups at nodes whose table is incomplete; rendezvous placement has none."""
    from p2pinfer.core.dht import kbucket_sizes, routing_table_complete

    built = build_requests(WorkloadSpec(requests=600), 48, 3)
    kad = replace(DIR, nodes=48, directory=DirectoryConfig(placement="kademlia"), churn_interval_s=4.0)
    sim, result = run(kad, built)
    keys = sorted(sim.dht_members.values())
    incomplete = [m for m, k in sim.dht_members.items() if not routing_table_complete(kbucket_sizes(keys, exclude=k))]
    assert incomplete, "this swarm must have nodes with a full bucket"
    d = result["discovery"]
    dht = d["directory"]["dht"]
    assert dht["lookups"]["refresh"] >= result["churn"]["joins"] > 0  # a joining node refreshes its table
    assert dht["lookups"]["resolve"] > 0
    assert dht["find_node_requests"] <= 10 * sum(dht["lookups"].values())  # one round of ALPHA per lookup
    by_kind = d["in_bytes_per_node_per_s_by_kind"]
    assert by_kind["directory dht refresh"] > 0 and by_kind["directory dht resolve"] > 0
    assert abs(sum(by_kind.values()) - result["gossip_bytes_per_node_per_s"]) < 1.0
    _, rdv = run(replace(kad, directory=DirectoryConfig(placement="rendezvous")), built)
    assert rdv["discovery"]["directory"]["dht"] is None
    assert not any("dht" in k for k in rdv["discovery"]["in_bytes_per_node_per_s_by_kind"])
