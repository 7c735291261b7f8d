"""Limits on what one peer may ask of a node, with node processes.

A peer that opens more generate streams than ``max_streams_per_peer`` gets
a BUSY answer that says why, on each stream over the limit; the node keeps
serving that peer's other streams and every other peer. Absurd generation
parameters are refused on the wire with BAD_REQUEST and the limit named.
"""

from __future__ import annotations

import random

import pytest

from p2pinfer.lab.node_process import fast_config, wait_until

pytestmark = pytest.mark.slow


def prompt(seed: int, n: int = 64) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(256, 49152) for _ in range(n)]


def test_too_many_streams_from_one_peer_are_refused_and_others_still_served(cluster):
    # B decodes at 11.5 ms per token, so 200-token answers keep streams busy.
    b = cluster.start("B", fast_config(speed=1.0, max_streams_per_peer=3))
    # B's engine serves one request at a time, so C's request waits behind A's three 200-token
    # answers: at least 7.5 s of modelled decode before B sends C anything, plus whatever a loaded
    # machine adds. C's stall timeout must not be what this test measures (10 s left ~1 s of slack).
    a, c = cluster.start_many(
        {
            "A": fast_config(bootstrap=(b.addr,), speed=0.1),
            "C": fast_config(bootstrap=(b.addr,), speed=0.1, stall_timeout_s=120.0),
        }
    )
    cluster.wait_full_view(["A", "B", "C"])
    flood = a.start_call("flood_streams", peer=b.peer_id, n=8, tokens=prompt(1), max_tokens=200, hold_s=1.0)
    wait_until(lambda: b.call("status")["counters"]["streams_refused"] >= 5, 20, what="B refuses A's extra streams")
    # While A holds its three streams, C is served by B as usual (after A's work, in B's FIFO).
    other = c.call("generate", tokens=prompt(2), max_tokens=2, prefer=b.peer_id)
    assert other["served_by"] == b.peer_id and [att["outcome"] for att in other["attempts"]] == ["done"], other
    answers = flood(40)
    served = [x for x in answers if x.get("kind") == "TokenChunk"]
    refused = [x for x in answers if x.get("error") == "BUSY"]
    assert len(served) == 3 and len(refused) == 5, answers
    for x in refused:
        assert "too many streams" in x["message"] and "limit is 3 per peer" in x["message"], x
    status = b.call("status")
    assert status["counters"]["streams_refused"] == 5
    assert status["counters"]["forwards_refused"]["BUSY"] == 5
    # A's streams are gone once it reset them, and A is served again.
    wait_until(lambda: a.peer_id not in b.call("status")["streams_per_peer"], 10, what="A's streams closed on B")
    again = a.call("generate", tokens=prompt(3), max_tokens=2, prefer=b.peer_id)
    assert again["served_by"] == b.peer_id


def test_absurd_generation_parameters_are_refused_with_the_limit_named(cluster):
    a, b, c = cluster.three()

    def send(**fields):
        return a.call("send_raw", peer=b.peer_id, data_hex=a.call("encode_request", **fields))["frames"]

    huge = send(token_ids=[300, 301], params={"max_tokens": 10**6})
    assert huge[0]["error"] == "BAD_REQUEST" and "max_tokens must be an integer in 1..8192" in huge[0]["message"]
    hot = send(token_ids=[300, 301], params={"max_tokens": 4, "temperature": 1e9})
    assert hot[0]["error"] == "BAD_REQUEST" and "temperature" in hot[0]["message"]
    # Prompt plus max_tokens over the context: TOO_LARGE, with both figures.
    long = send(token_ids=[300] * 8000, params={"max_tokens": 500})
    assert long[0]["error"] == "TOO_LARGE" and "8000" in long[0]["message"] and "8192" in long[0]["message"]
    # And the entry node refuses the same before sending anything anywhere.
    with pytest.raises(Exception, match="max_tokens"):
        a.call("generate", tokens=[300, 301], max_tokens=10**6)
    assert b.call("status")["counters"]["forwards_served"] == 0
    assert a.call("generate", tokens=prompt(4), max_tokens=2, prefer=b.peer_id)["served_by"] == b.peer_id
