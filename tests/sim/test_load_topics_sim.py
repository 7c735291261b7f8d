"""The simulator's load topics: ``hash`` (the live node's) and ``fill`` (the old model)."""

from __future__ import annotations

from collections import Counter
import json
from pathlib import Path
import subprocess
import sys
from typing import Any

import pytest

from p2pinfer.core.load_topics import topic_count, topic_index
from p2pinfer.core.router import GossipConfig
from p2pinfer.sim import SimConfig, Simulator, without_wall_clock
from p2pinfer.sim.runner import WorkloadSpec, build_requests

ROOT = Path(__file__).resolve().parents[2]


def run(config: SimConfig, requests: int) -> tuple[Simulator, dict[str, Any]]:
    reqs, encoder, info = build_requests(WorkloadSpec(requests=requests), config.nodes, config.seed)
    sim = Simulator(config, reqs, encoder, workload=info)
    return sim, sim.run()


def test_hashed_topics_are_the_live_nodes() -> None:
    sim, result = run(SimConfig(nodes=64, discovery="directory", seed=2), 400)
    count = topic_count(64, 8)
    assert count == 8
    for node in sim.alive:
        assert node.topic_count == count and node in sim.topics[sim.topic_keys[(count, topic_index(node.id, count))]]
    sizes = Counter(len(sim.topics[p]) for (c, _), p in sim.topic_keys.items() if c == count)
    assert sum(size * k for size, k in sizes.items()) == 64 and len(sizes) > 1  # sizes vary, unlike fill's
    # Each copy's envelope grows by what "/p2pinfer/load/1/<fp>/8/<i>" adds to "/p2pinfer/digest/1/<fp>".
    assert set(sim.topic_extra_bytes.values()) == {len("load/1//8/0") - len("digest/1/")}
    summary = result["discovery"]["load_topics"]
    assert summary["scheme"] == "hash" and summary["counts_at_end"] == [8] and summary["moves"] == 0
    assert summary["topic_sizes_at_end"]["mean"] == 8.0
    assert result["params"]["gossip"]["load_topics"] == "hash"


def test_load_bytes_per_node_stay_flat_with_hashed_topics() -> None:
    """Reports heard per node depend on the topic's size, not the swarm's."""
    by_n = {}
    for n in (16, 128):
        _, result = run(SimConfig(nodes=n, discovery="directory", seed=2), 12 * n)
        by_n[n] = result["discovery"]["in_bytes_per_node_per_s_by_kind"]["gossip load"]
    _, one_topic = run(SimConfig(nodes=128, discovery="directory", topic_size=128, seed=2), 12 * 128)
    assert by_n[128] < 1.5 * by_n[16]
    assert one_topic["discovery"]["in_bytes_per_node_per_s_by_kind"]["gossip load"] > 4 * by_n[128]


def test_nodes_move_when_the_swarm_crosses_a_count() -> None:
    """12 nodes in topics of 8 make two topics (12 / 8 = 1.5); a node that left
    leaves 11 (1.375: one topic) until its replacement joins."""
    config = SimConfig(nodes=12, discovery="directory", seed=3, churn_interval_s=4.0, rejoin_delay_s=3.0,
                       gossip=GossipConfig(keepalive_interval_s=1.0, peer_ttl_s=3.0))
    sim, result = run(config, 300)
    assert result["requests"] == 300 and not sim.pending
    assert result["discovery"]["load_topics"]["moves"] > 0
    for node in sim.alive:
        assert node in sim.topics[node.topic]
        assert sum(node in members for members in sim.topics) == 1  # in one topic only


def test_fill_is_the_old_model_and_load_topics_are_validated() -> None:
    sim, result = run(SimConfig(nodes=16, discovery="directory", topic_size=4, load_topics="fill", seed=3), 200)
    assert sorted(len(t) for t in sim.topics) == [4, 4, 4, 4] and not sim.topic_keys
    assert "load_topics" not in result["discovery"] and "load_topics" not in result["params"]["gossip"]
    with pytest.raises(ValueError, match="load_topics"):
        SimConfig(discovery="directory", load_topics="random").validate()
    # Gossip discovery keeps its random topics whatever load_topics says.
    sim, _ = run(SimConfig(nodes=16, topic_size=4, seed=3), 100)
    assert not sim.topic_keys


@pytest.mark.slow
def test_fill_reproduces_the_published_256_node_run_exactly(tmp_path: Path) -> None:
    """docs/results/issue19-sim-dht-256-churn-directory-4096.json (the model every figure before load
    topics were live used), on the cost model it ran (given as ``--calibration``, so that a later
    change of the defaults shows here only as the published file's own ``cost_model``)."""
    published = json.loads((ROOT / "docs/results/issue19-sim-dht-256-churn-directory-4096.json").read_text())
    words = published["provenance"]["command"].split()
    args = words[words.index("simulate") + 1:]
    assert args[args.index("--load-topics") + 1] == "fill" and "--calibration" not in args
    ran = published["cost_model"]
    calibration = tmp_path / "engine.json"
    calibration.write_text(json.dumps({"prefill_ms_per_token": ran["prefill_ms_per_token"], "decode_ms_per_token": ran["decode_ms_per_token"],
                                       "restore_ms": ran["cache_hit_overhead_ms"], "request_overhead_ms": ran["request_overhead_ms"]}))
    out = subprocess.run([sys.executable, "-m", "p2pinfer.cli.main", "simulate", *args,
                          "--calibration", str(calibration)], capture_output=True, text=True, check=True, cwd=ROOT)
    result = json.loads(out.stdout)
    old = without_wall_clock(published)
    new = without_wall_clock(result)
    assert new["cost_model"].pop("source") != old["cost_model"].pop("source")  # the file's name, not the figures
    # Fields added to results since (the simulator's slots) are not figures of that run.
    assert only_published(new, old) == old


def only_published(new: object, old: object) -> object:
    """``new`` restricted to the keys ``old`` has, recursively."""
    if isinstance(new, dict) and isinstance(old, dict):
        return {k: only_published(new[k], old[k]) if k in new else new.get(k) for k in old}
    return new
