"""Load reports in small topics on real node processes (``discovery = "directory"``).

Five directory nodes with ``load_topic_nodes = 2`` make two load topics (5 / 2
rounds to 2, :func:`~p2pinfer.core.load_topics.topic_count`). Their identities
are chosen (key files made here) so that three hash to one topic and two to
the other, then: each node publishes on its own topic and hears the reports
of its own topic's peers only; a digest published on a load topic is
rejected as ``wrong-topic``; and with one gossip-mode node in the swarm the
directory nodes' load reports go on the model topic, where it hears them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from p2pinfer.core.load_topics import topic_index, topic_of
from p2pinfer.lab.node_process import fast_config, wait_until
from p2pinfer.net.identity import load_or_create_identity

from test_directory_live import DIRECTORY, GOSSIP, prompt  # tests/net is on sys.path (no packages)

pytestmark = pytest.mark.slow


def key_files(tmp_path: Path, split: tuple[int, ...], count: int) -> list[tuple[str, str, int]]:
    """(key file, peer id, topic index): ``split[i]`` identities in topic ``i`` of ``count``."""
    from libp2p.peer.id import ID

    want = list(split)
    out: list[tuple[str, str, int]] = []
    n = 0
    while any(want):
        path = tmp_path / f"key{n}"
        n += 1
        peer = ID.from_pubkey(load_or_create_identity(path).public_key).to_base58()
        index = topic_index(peer, count)
        if want[index]:
            want[index] -= 1
            out.append((str(path), peer, index))
        else:
            path.unlink()
    return out


def start(cluster, keys, modes=None, **overrides):
    """The first key's node first, the others bootstrapping from it."""
    modes = modes or ["directory"] * len(keys)
    names = [f"N{i}" for i in range(len(keys))]

    def cfg(i, **more):
        return fast_config(discovery=modes[i], speed=1.0, gossip=GOSSIP, directory=DIRECTORY, key_file=keys[i][0],
                           **overrides, **more)

    first = cluster.start(names[0], cfg(0))
    rest = cluster.start_many({names[i]: cfg(i, bootstrap=(first.addr,)) for i in range(1, len(keys))})
    cluster.wait_full_view(names, timeout_s=120)
    return [first, *rest]


def discovery(node):
    return node.call("status")["discovery"]


def test_two_load_topics_each_node_hears_its_own_and_a_digest_there_is_rejected(cluster, tmp_path):
    keys = key_files(tmp_path, (3, 2), 2)
    nodes = start(cluster, keys, load_topic_nodes=2)
    fp = nodes[0].call("status")["model_fingerprint"]
    mine = {n.peer_id: topic_of(n.peer_id, fp, 2) for n in nodes}
    assert [n.peer_id for n in nodes] == [k[1] for k in keys]
    # Every node on its own topic of two, and only there once the grace period is over.
    wait_until(lambda: all(discovery(n)["load_topics_subscribed"] == [mine[n.peer_id]] for n in nodes), 90,
               what="every node on its own load topic only")
    for n in nodes:
        d = discovery(n)
        assert d["load_topic"] == mine[n.peer_id] and d["load_topic_count"] == 2
        assert d["load_reports_on"] == [mine[n.peer_id]]  # not the model topic: no gossip-mode peer

    # Each node's load changes (a local request): reports go out on its topic.
    before = {n.peer_id: discovery(n)["load_reports_heard_by_peer"] for n in nodes}
    for i, n in enumerate(nodes):
        assert n.call("generate", tokens=prompt(7000 + i, 64), max_tokens=2, prefer="local")["served_locally"]
    same = {n.peer_id: {p for p in mine if p != n.peer_id and mine[p] == mine[n.peer_id]} for n in nodes}

    def heard_since(n):
        now = discovery(n)["load_reports_heard_by_peer"]
        return {p for p, c in now.items() if c > before[n.peer_id].get(p, 0)}

    wait_until(lambda: all(heard_since(n) >= same[n.peer_id] for n in nodes), 60, what="each node hears its topic's peers")
    for n in nodes:
        assert heard_since(n) == same[n.peer_id]  # and no one else's

    # A digest on a load topic is dropped by every receiver as wrong-topic.
    sender = next(n for n in nodes if len(same[n.peer_id]) == 2)
    payload = sender.call("gossip_digest_hex")
    receivers = [n for n in nodes if n.peer_id in same[sender.peer_id]]
    sender.call("publish_raw", data_hex=payload, topic=mine[sender.peer_id])
    wait_until(lambda: all(r.call("status")["counters"]["gossip_rejected"].get("wrong-topic", 0) >= 1 for r in receivers),
               30, what="the digest on a load topic rejected")
    assert all(r.call("status")["counters"]["digests_applied"] == 0 for r in receivers)


def test_a_mixed_swarm_keeps_load_reports_on_the_model_topic(cluster, tmp_path):
    keys = key_files(tmp_path, (2, 2), 2)
    nodes = start(cluster, keys, modes=["directory", "directory", "directory", "gossip"], load_topic_nodes=2)
    a, g = nodes[0], nodes[3]
    model_topic = a.call("status")["topic"]
    wait_until(lambda: all(discovery(n)["load_reports_on"] == [model_topic] for n in nodes[:3]), 60,
               what="directory nodes publish load on the model topic while a gossip node is known")
    # A long local prefill on A (4,000 tokens at 3.43 ms, 14 s): G sees A's queue from A's load reports.
    pending = a.start_call("generate", tokens=prompt(7100, 4000), max_tokens=2, prefer="local")

    def g_sees_a_queued():
        peer = next((p for p in g.call("status")["peers"] if p["peer_id"] == a.peer_id), None)
        return peer is not None and (peer["queued_prefill_tokens"] > 0 or peer["active_requests"] > 0)

    wait_until(g_sees_a_queued, 15, what="G hears A's load")
    assert pending(60)["served_locally"]
