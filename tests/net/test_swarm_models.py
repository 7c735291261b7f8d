"""Several models in one swarm (simulated engines, nodes in one process).

The real two-model swarm (SmolLM2 and Gemma 3 in separate processes, through
the OpenAI API) is tests/e2e/test_two_models.py; these check the overlay and
the delegation rules where they are easy to see.
"""

from __future__ import annotations

import random

import pytest
import trio

from p2pinfer.core.swarm_models import SwarmModels
from p2pinfer.engines.base import InvalidRequestError
from p2pinfer.lab.node_process import fast_config, wait_for
from p2pinfer.net.wire import GossipRejected, decode_model_announcement, encode_model_announcement
from p2pinfer.node import ModelUnavailable, Node


def other(**kw):
    return fast_config(engine_options={"model": "another-model-1b"}, **kw)


async def test_a_request_for_a_model_served_elsewhere_is_delegated_to_a_node_of_that_model():
    async with Node(fast_config()) as b1, Node(fast_config(bootstrap=(b1.addrs[0],))) as b2, \
            Node(other(bootstrap=(b1.addrs[0],))) as a:
        fp_b = b1.router.fingerprint_hex
        assert a.router.fingerprint_hex != fp_b
        # A learns from the model topic that B1 and B2 serve the other model.
        await wait_for(lambda: set(a.swarm_models.serving(fp_b, _now())) == {b1.peer_id, b2.peer_id}, 10)
        assert a.swarm_models.resolve("simulated-smollm2-135m", _now()) == fp_b
        assert a.swarm_models.resolve(fp_b, _now()) == fp_b
        models = {m.fingerprint: m for m in a.swarm_models.models(_now())}
        assert models[fp_b].nodes == 2 and not models[fp_b].served_here
        assert models[a.router.fingerprint_hex].nodes == 1 and models[a.router.fingerprint_hex].served_here

        result = await a.complete("hello there, how are you", max_tokens=4, model=fp_b)
        assert result.served_by in (b1.peer_id, b2.peer_id) and not result.served_locally
        assert result.model == fp_b and result.policy == "delegate"
        assert result.generated_tokens == 4 and result.prompt_tokens > 0
        # Chat messages travel too, tokenised by the serving model's template.
        chat = await a.complete([{"role": "user", "content": "hi"}], max_tokens=2, model=fp_b)
        assert chat.served_by in (b1.peer_id, b2.peer_id) and chat.generated_tokens == 2
        # A's own model is still served here.
        own = await a.complete("hello", max_tokens=2)
        assert own.served_locally and own.model == a.router.fingerprint_hex
        # Token ids are the serving model's tokenizer's: an entry without it cannot send them.
        with pytest.raises(Exception, match="token ids cannot be sent"):
            await a.complete([1, 2, 3], max_tokens=2, model=fp_b)


async def test_bad_delegated_request_is_a_bad_request_and_a_vanished_model_is_unavailable():
    async with Node(fast_config(engine_options={"context_size": 64})) as b, Node(other(bootstrap=(b.addrs[0],))) as a:
        fp_b = b.router.fingerprint_hex
        await wait_for(lambda: a.swarm_models.serving(fp_b, _now()) == [b.peer_id], 10)
        # Too long for B's context: B answers TOO_LARGE, A raises the engine's error (a 413 at the API).
        with pytest.raises(InvalidRequestError, match="exceeds the context"):
            await a.complete("word " * 200, max_tokens=4, model=fp_b)
    # B has stopped (left the async with): once its announcement expires, the model is known but unserved.
    # (Covered without waiting by the unit test below.)


def _now() -> float:
    import time

    return time.monotonic()


def test_model_table_resolves_counts_expires_and_remembers():
    t = SwarmModels("self", "aaaa", "own-model", base_interval_s=4.0, remember_s=100.0)  # TTL 2.5 x 4 s
    assert t.heard("p1", "bbbb", "other-model", 0.0)
    assert not t.heard("p1", "bbbb", "other-model", 1.0)  # nothing new
    assert t.heard("p2", "bbbb", "other-model", 1.0)
    assert t.resolve("other-model", 2.0) == "bbbb" and t.resolve("bbbb", 2.0) == "bbbb"
    assert t.resolve("own-model", 2.0) == "aaaa" and t.resolve("nope", 2.0) is None
    assert [(m.alias, m.nodes, m.served_here) for m in t.models(2.0)] == [("own-model", 1, True), ("other-model", 2, False)]
    assert sorted(t.delegates("bbbb", 2.0, random.Random(1), 3)) == ["p1", "p2"]
    t.mark_busy("p1", 2.0, 5.0)
    assert t.delegates("bbbb", 3.0, random.Random(1), 3) == ["p2", "p1"]  # the busy one last
    # Silent past the TTL: nobody serves it now, but it is remembered (503, not 404).
    assert t.serving("bbbb", 20.0) == [] and t.resolve("other-model", 20.0) == "bbbb"
    assert [m.alias for m in t.models(20.0)] == ["own-model"]
    # Silent past remember_s: forgotten (404).
    assert t.resolve("other-model", 200.0) is None
    # A peer that switched model is counted under the new one only.
    t.heard("p3", "cccc", "third", 300.0)
    t.heard("p3", "dddd", "fourth", 301.0)
    assert t.serving("cccc", 301.0) == [] and t.serving("dddd", 301.0) == ["p3"]


def test_model_announcements_are_checked():
    data = encode_model_announcement("peerA", "0123abcd", "gemma-3-270m", ["/ip4/127.0.0.1/tcp/1"])
    ann = decode_model_announcement(data, sender="peerA")
    assert (ann.fingerprint, ann.alias, ann.addrs) == ("0123abcd", "gemma-3-270m", ("/ip4/127.0.0.1/tcp/1",))
    for payload, sender, reason in [
        (data, "peerB", "spoofed"),
        (encode_model_announcement("peerA", "NOT-HEX", "x", []), "peerA", "malformed"),
        (encode_model_announcement("peerA", "abcd", "", []), "peerA", "malformed"),
        (b"\xff\xff", "peerA", "malformed"),
        (b"x" * 9000, "peerA", "oversized"),
    ]:
        with pytest.raises(GossipRejected) as info:
            decode_model_announcement(payload, sender=sender)
        assert info.value.reason == reason


async def test_no_node_serving_the_model_is_model_unavailable():
    async with Node(fast_config()) as a:
        # A model heard of once, whose nodes are gone.
        a.swarm_models.heard("ghost", "beef", "ghost-model", _now() - 100)
        assert a.swarm_models.resolve("ghost-model", _now()) == "beef"
        with pytest.raises(ModelUnavailable, match="ghost-model"):
            await a.complete("hi", max_tokens=2, model="beef")


async def test_a_node_whose_connection_closes_stops_counting_at_once_not_after_the_ttl():
    """Model announcements are slow (a minute) so that an idle swarm stays
    quiet (issue 14); a node that leaves is dropped from the model table when
    its connection closes, long before the 2.5-interval TTL."""
    async with Node(other()) as a:
        ttl = a.swarm_models.ttl_s
        assert ttl == 2.5 * a.router.config.gossip.model_interval_s
        async with Node(fast_config(bootstrap=(a.addrs[0],))) as b:
            fp_b = b.router.fingerprint_hex
            await wait_for(lambda: a.swarm_models.serving(fp_b, _now()) == [b.peer_id], 10)
            await wait_for(lambda: b.peer_id in a.membership.connected(), 10)
        left = trio.current_time()
        await wait_for(lambda: a.swarm_models.serving(fp_b, _now()) == [], ttl / 10)
        assert trio.current_time() - left < ttl / 10
