"""A swarm with three model fingerprints, every node its own process.

A and B run the default simulated model; C runs another model, D the same
model under another chat template. C and D dial A and B directly (they are
in their bootstrap lists), so each side meets the other and finds it out:
the digest pull is refused with MODEL_MISMATCH. From then on neither side
routes to the other or takes its digests, even for a prompt that only the
other side caches, and each node logs why once per peer and fingerprint.
"""

from __future__ import annotations

import random
import time

import pytest

from p2pinfer.lab.node_process import fast_config, wait_until

pytestmark = pytest.mark.slow


def prompt(seed: int, n: int = 320) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(256, 49152) for _ in range(n)]


def mismatch_lines(node, peer_id: str) -> list[str]:
    return [line for line in node.log_tail(1 << 20).splitlines() if "runs another model" in line and peer_id in line]


def test_peers_of_another_model_are_ignored_never_routed_to_and_logged_once(cluster):
    b = cluster.start("B", fast_config(speed=0.1))
    a = cluster.start("A", fast_config(bootstrap=(b.addr,), speed=0.1))
    c, d = cluster.start_many(
        {
            "C": fast_config(bootstrap=(b.addr, a.addr), speed=0.1, engine_options={"model": "another-model-1b"}),
            "D": fast_config(bootstrap=(b.addr, a.addr), speed=0.1, engine_options={"chat_template": "another-template"}),
        }
    )
    cluster.wait_full_view(["A", "B"])
    fp = {name: cluster[name].call("status")["model_fingerprint"] for name in "ABCD"}
    assert fp["A"] == fp["B"] and len({fp["A"], fp["C"], fp["D"]}) == 3

    # Both honest-model nodes find C and D out, with the fingerprint each runs.
    for node in (a, b):
        wait_until(
            lambda: node.call("status")["other_model_peers"] == {c.peer_id: fp["C"], d.peer_id: fp["D"]},
            20,
            what=f"{node.name} finds C and D out",
        )
    # C and D cache the very prefix A will be asked for; A and B do not.
    shared = prompt(5)
    for node in (c, d):
        assert node.call("generate", tokens=shared, max_tokens=1, prefer="local")["served_locally"]
    deadline = time.monotonic() + 3.0  # more than two full-digest intervals: their digests had time to leak
    while time.monotonic() < deadline:
        assert set(a.call("view")) == {b.peer_id} and set(b.call("view")) == {a.peer_id}
        time.sleep(0.2)
    for i in range(4):
        result = a.call("generate", tokens=shared + [400 + i], max_tokens=2)
        assert result["served_by"] in (a.peer_id, b.peer_id), result["reason"]
        assert all(att["target"] not in (c.peer_id, d.peer_id) for att in result["attempts"])
    # The other side does not route to us either.
    assert c.call("view") == {} and d.call("view") == {}

    # Even when told to use C, A cannot: C refuses and A falls back.
    for i in range(2):
        forced = a.call("generate", tokens=shared + [500 + i], max_tokens=2, prefer=c.peer_id)
        first = forced["attempts"][0]
        assert first["target"] == c.peer_id and first["outcome"] == "MODEL_MISMATCH", forced["attempts"]
        assert "model fingerprint" in first["message"]
        assert forced["served_by"] in (a.peer_id, b.peer_id) and forced["generated_tokens"] == 2
    assert c.call("status")["counters"]["forwards_refused"]["MODEL_MISMATCH"] == 2

    # Each node says why once per peer, however often that peer showed up
    # (pulls both ways, forwards, refusals).
    for node, others in ((a, (c, d)), (b, (c, d)), (c, (a, b))):
        for other in others:
            lines = mismatch_lines(node, other.peer_id)
            assert len(lines) == 1, (node.name, other.name, lines)
    assert fp["C"] in mismatch_lines(a, c.peer_id)[0] and fp["A"] in mismatch_lines(a, c.peer_id)[0]
