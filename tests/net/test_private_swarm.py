"""Private swarms, with node processes: the pre-shared key and the keyed digests.

The in-process test in test_node.py checks the handshake; here every node
is its own process, and the digest side is checked too: what a node
advertises for a known prompt, seen from inside the swarm, matches the
prompt's block hashes only when they are computed with the swarm secret.
"""

from __future__ import annotations

import random

import pytest

from p2pinfer.core.blocks import BlockHasher
from p2pinfer.engines.simulated import SimulatedEngine
from p2pinfer.lab.node_process import fast_config, wait_until

pytestmark = pytest.mark.slow

SECRET = b"volunteers of the northern valleys"


def prompt(seed: int, n: int = 320) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(256, 49152) for _ in range(n)]


def block_hashes(tokens: list[int], secret: bytes | None) -> set[int]:
    """What a reader who knows the prompt (and guesses ``secret``) would look for."""
    return set(BlockHasher(SimulatedEngine().fingerprint, secret).hashes(tokens))


def test_private_swarm_admits_only_key_holders_and_its_digests_hide_prompts(cluster):
    private = {"swarm_secret": SECRET, "private_network": True}
    b = cluster.start("B", fast_config(speed=0.1, **private))
    a, outsider, guesser = cluster.start_many(
        {
            "A": fast_config(bootstrap=(b.addr,), speed=0.1, **private),
            "O": fast_config(bootstrap=(b.addr,), connect_timeout_s=2.0),  # no key at all
            "W": fast_config(bootstrap=(b.addr,), connect_timeout_s=2.0, swarm_secret=b"a guess", private_network=True),
        }
    )
    cluster.wait_full_view(["A", "B"])

    # Holders of the key form a working swarm: A forwards to B's cached prefix.
    known = prompt(1)
    b.call("generate", tokens=known, max_tokens=1, prefer="local")
    wait_until(lambda: a.call("view_hashes", peer=b.peer_id) == b.call("cache_hashes"), 10, what="A learns B's cache")
    served = a.call("generate", tokens=known + [300, 301], max_tokens=2)
    assert served["served_by"] == b.peer_id and served["reused_tokens"] == 320

    # Without the key (or with another one) a node cannot complete a handshake.
    for node in (outsider, guesser):
        wait_until(lambda: node.call("status")["counters"]["dials_failed"] >= 2, 20, what=f"{node.name} retried B")
        status = node.call("status")
        assert status["counters"]["dials_ok"] == 0, node.log_tail()
        assert status["connected_peers"] == [] and status["peers"] == []
    assert set(b.call("status")["connected_peers"]) == {a.peer_id}
    assert set(b.call("view")) == {a.peer_id}

    # B's digest, as a member of the swarm receives it, names the known
    # prompt only under the swarm's key: computed without it, or with a
    # guessed key, not one block hash of the prompt appears.
    advertised = set(a.call("view_hashes", peer=b.peer_id))
    assert block_hashes(known, SECRET) <= advertised
    for guess in (None, b"a guess", SECRET + b" "):
        assert not block_hashes(known, guess) & advertised


def test_keyed_digests_tell_a_reader_without_the_secret_nothing(cluster):
    # A public swarm (no pre-shared key) whose node F keys its hashes: E
    # joins without the secret and receives F's whole digest, yet cannot
    # tell that F caches a prompt E knows.
    f = cluster.start("F", fast_config(speed=0.1, swarm_secret=SECRET))
    e = cluster.start("E", fast_config(bootstrap=(f.addr,), speed=0.1))
    cluster.wait_full_view(["E", "F"])
    known = prompt(2)
    f.call("generate", tokens=known, max_tokens=1, prefer="local")
    truth = f.call("cache_hashes")
    wait_until(lambda: e.call("view_hashes", peer=f.peer_id) == truth, 10, what="E reads F's digest")
    read = set(truth)
    assert len(read) == 320 // 16
    assert not block_hashes(known, None) & read
    assert block_hashes(known, SECRET) == read  # with the secret, the prompt is plain to see
    # E's own routing finds nothing either: the known prompt is not matched at F.
    result = e.call("generate", tokens=known + [300], max_tokens=1)
    assert result["served_locally"] and result["predicted_reused_tokens"] == 0
