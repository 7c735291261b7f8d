"""Nodes in one process (one trio loop): lifecycle, streams, the sync wrapper.

The multi-process behaviour is in test_cluster.py; these check what is
easier to see from inside: no stream is left open, shutdown is clean, and
the public API's results say what happened.
"""

from __future__ import annotations

from contextlib import aclosing
from dataclasses import replace
import threading
import time

import pytest
from libp2p.peer.id import ID
import trio

from p2pinfer.engines.base import GenerationParams, InvalidRequestError, TokenChunk
from p2pinfer.engines.simulated import SimulatedEngine, simulated_next_token
from p2pinfer.net.forward import GENERATE_PROTOCOL
from p2pinfer.lab.node_process import fast_config, wait_for
from p2pinfer.node import GenerateResult, Node, NodeError, RequestFailed, SyncNode


def generate_streams(node: Node, peer_id: str) -> list:
    out = []
    for conn in node.host.get_network().connections.get(ID.from_base58(peer_id), []):
        out += [s for s in conn.get_streams() if s.get_protocol() == GENERATE_PROTOCOL]
    return out


async def test_forwarded_requests_reuse_streams_and_close_them_on_both_sides():
    async with Node(fast_config()) as b, Node(fast_config(bootstrap=(b.addrs[0],))) as a:
        await a.wait_for_peers(1)
        tokens = list(range(300, 400))
        for _ in range(5):
            result = await a.complete(tokens, max_tokens=3, prefer=b.peer_id)
            assert result.served_by == b.peer_id and result.hops == 1
        # Five sequential forwards, one stream (the pool reuses it).
        assert a.forward_client.streams_opened == 1
        assert len(generate_streams(b, a.peer_id)) == 1
        await a.forward_client.aclose()
        # Both sides closed it: nothing lingers on the target.
        await wait_for(lambda: not generate_streams(b, a.peer_id))
        await wait_for(lambda: not generate_streams(a, b.peer_id))
        # And the next forward simply opens a fresh one.
        assert (await a.complete(tokens, max_tokens=2, prefer=b.peer_id)).served_by == b.peer_id


async def test_abandoned_request_resets_the_stream_and_frees_the_target():
    # B decodes at 11.5 ms per token: 200 tokens would take 2.3 s.
    async with Node(fast_config(speed=1.0)) as b, Node(fast_config(bootstrap=(b.addrs[0],))) as a:
        await a.wait_for_peers(1)
        # A new peer's first answers are held back until checked (probation,
        # p2pinfer/core/verify.py); after them its answers stream. Then the
        # pool's idle stream is closed, so that only the abandoned one counts.
        for i in range(a.spot_checks.config.probation_answers):
            assert (await a.complete(list(range(500 + 50 * i, 540 + 50 * i)), max_tokens=2, prefer=b.peer_id)).served_by == b.peer_id
        await a.forward_client.aclose()
        await wait_for(lambda: not generate_streams(b, a.peer_id))
        served_before = b.counters.forwards_served
        got = []
        async with aclosing(a.generate(list(range(300, 340)), max_tokens=200, prefer=b.peer_id)) as items:
            async for item in items:
                got.append(item)
                if len(got) == 3:
                    break
        await wait_for(lambda: b.engine.load().active_requests == 0, 5)
        await wait_for(lambda: not generate_streams(b, a.peer_id), 5)
        assert b.counters.forwards_served == served_before
        assert a.forward_client.idle_streams() == 0  # a reset stream never returns to the pool


async def test_stream_api_yields_chunks_then_a_result():
    async with Node(fast_config()) as a:
        items = [item async for item in a.generate("hello there, how are you today?", max_tokens=6)]
        *chunks, result = items
        assert all(isinstance(c, TokenChunk) for c in chunks)
        assert isinstance(result, GenerateResult)
        assert result.token_ids == [t for c in chunks for t in c.token_ids]
        assert result.served_locally and result.served_by == a.peer_id and result.hops == 0
        assert result.generated_tokens == 6 and result.decision is not None
        status = a.status()
        assert status["counters"]["requests"] == 1 and status["counters"]["served_local"] == 1
        with pytest.raises(InvalidRequestError):
            await a.complete([], max_tokens=2)
        with pytest.raises(NodeError, match="prompt must be"):
            await a.complete([1.5, 2.5])  # type: ignore[list-item]


async def test_unreachable_preferred_peer_falls_back_to_local():
    async with Node(fast_config(connect_timeout_s=1.0)) as a:
        ghost = "12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN"
        result = await a.complete(list(range(300, 340)), max_tokens=2, prefer=ghost)
        assert result.served_locally
        assert [att.outcome for att in result.attempts] == ["failed", "done"]
        assert a.counters.forward_failures == 1


def test_sync_wrapper_runs_a_node_for_scripts():
    with SyncNode(fast_config()) as node:
        assert node.peer_id and node.addrs
        result = node.complete("a short prompt for the sync wrapper", max_tokens=3)
        assert result.generated_tokens == 3 and result.served_locally
        assert node.status()["counters"]["requests"] == 1
    assert not any(t.name == "p2pinfer-node" for t in threading.enumerate())


async def test_private_network_admits_only_holders_of_the_secret():
    secret = {"swarm_secret": b"our swarm", "private_network": True}
    async with Node(fast_config(**secret)) as b:
        async with Node(fast_config(bootstrap=(b.addrs[0],), **secret)) as a:
            await a.wait_for_peers(1)
            assert (await a.complete(list(range(300, 340)), max_tokens=2, prefer=b.peer_id)).served_by == b.peer_id
        outsider = fast_config(
            bootstrap=(b.addrs[0],), swarm_secret=b"another swarm", private_network=True, connect_timeout_s=2.0
        )
        async with Node(outsider) as c:
            await wait_for(lambda: c.counters.dials_failed >= 1, 15)
            assert c.counters.dials_ok == 0 and len(c.router.view) == 0
        async with Node(fast_config(bootstrap=(b.addrs[0],), connect_timeout_s=2.0)) as d:  # no pre-shared key
            await wait_for(lambda: d.counters.dials_failed >= 1, 15)
            assert d.counters.dials_ok == 0 and len(d.router.view) == 0


async def test_mdns_finds_a_peer_on_the_local_link_without_bootstrap():
    async with Node(fast_config(mdns=True)) as a, Node(fast_config(mdns=True)) as b:
        await a.wait_for_peers(1, 20)
        await b.wait_for_peers(1, 20)
        assert b.peer_id in a.router.view


def forge_claim(node: Node, peer_id: str, tokens: list[int]) -> None:
    """Make ``node`` believe that ``peer_id`` caches ``tokens`` (it does not)."""
    from p2pinfer.core.digest import Digest

    state = node.router.view.get(peer_id)
    lie = Digest(
        "delta",
        peer_id,
        node.router.fingerprint_hex,
        state.version + 1,
        state.version,
        frozenset(node.router.hasher.hashes(tokens)),
        epoch=state.epoch,
    )
    assert node.router.on_digest(lie, time.monotonic()) == "applied"


async def test_overclaiming_peer_loses_trust_through_real_forwards():
    # The paper policy follows the longest claimed match, so A forwards to B.
    async with Node(fast_config(speed=0.1)) as b, Node(
        fast_config(bootstrap=(b.addrs[0],), speed=0.1, policy="paper")
    ) as a:
        await a.wait_for_peers(1)
        tokens = list(range(1000, 1320))
        forge_claim(a, b.peer_id, tokens)
        first = await a.complete(tokens, max_tokens=1)
        assert first.served_by == b.peer_id
        assert (first.predicted_reused_tokens, first.reused_tokens) == (320, 0)
        assert a.router.view.get(b.peer_id).trust < 1.0
        # A few more disappointments and B is dropped for a while.
        for i in range(4):
            if b.peer_id in a.sanctions.remaining():
                break
            fresh = list(range(2000 + 400 * i, 2320 + 400 * i))
            forge_claim(a, b.peer_id, fresh)
            assert (await a.complete(fresh, max_tokens=1)).served_by == b.peer_id
        assert b.peer_id in a.sanctions.remaining() and a.counters.peers_distrusted == 1
        # Distrusted: out of the view, and its gossip does not bring it back.
        await trio.sleep(1.0)
        assert b.peer_id not in a.router.view
        assert (await a.complete(list(range(2000, 2320)), max_tokens=1)).served_locally


class StopBlindEngine(SimulatedEngine):
    """A peer whose engine ignores the client's stop strings (as an engine
    resumed mid-answer does with a stop that began in the earlier try)."""

    async def generate(self, tokens, params):  # type: ignore[override]
        async for item in super().generate(tokens, replace(params, stop=())):
            yield item


async def test_the_entry_ends_a_try_whose_engine_goes_past_the_stop_string():
    """The entry renders the whole answer: when it reaches a stop string the
    serving engine did not see, it ends the try there instead of waiting for
    max_tokens, and the answer is exactly the text before the stop."""
    async with Node(fast_config(), engine=StopBlindEngine(speed=0.0)) as b, Node(fast_config(bootstrap=(b.addrs[0],))) as a:
        await a.wait_for_peers(1)
        prompt = a.engine.tokenize("Alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november")
        seq = list(prompt)
        for _ in range(200):
            seq.append(simulated_next_token(seq))
        answer = seq[len(prompt):]
        pieces = [a.engine.token_bytes(t) for t in answer]
        # A stop string across two tokens, some way into the answer: the first n tokens whose text holds it.
        stop = next(p[-2:] + q[:2] for p, q in zip(pieces[8:], pieces[9:]) if len(p) >= 2 and len(q) >= 2).decode()
        n = next(k for k in range(1, 201) if stop in b"".join(pieces[:k]).decode())
        assert n < 200
        params = GenerationParams(max_tokens=200, stop=(stop,))
        for i in range(a.spot_checks.config.probation_answers):  # B's first answers are held back until checked
            await a.complete(list(range(500 + 50 * i, 540 + 50 * i)), max_tokens=2, prefer=b.peer_id)
        result = await a.complete(prompt, params, prefer=b.peer_id)
        assert result.served_by == b.peer_id
        assert result.generated_tokens == n and result.token_ids == answer[:n]
        assert result.text == b"".join(pieces).decode().split(stop)[0]
        assert result.finish_reason == "stop"
        # Served locally, the simulated engine stops there by itself: the same answer.
        alone = await a.complete(prompt, params, prefer=a.peer_id)
        assert (alone.token_ids, alone.text, alone.finish_reason) == (result.token_ids, result.text, "stop")


async def test_request_fails_explicitly_when_no_candidate_can_serve():
    async with Node(fast_config(engine_options={"max_queue": 0})) as a:
        with pytest.raises(RequestFailed) as info:
            await a.complete(list(range(300, 340)), max_tokens=2)
        assert [att.outcome for att in info.value.attempts] == ["BUSY"]
        assert a.counters.requests_failed == 1


async def test_a_lost_delta_is_healed_by_a_pull_not_by_waiting():
    from p2pinfer.core.router import GossipConfig

    # Full digests and keep-alives every 60 s: only the pull the gap asks for
    # can heal within this test.
    slow_full = GossipConfig(
        delta_interval_s=0.05, full_interval_s=60.0, load_interval_s=0.2, keepalive_interval_s=60.0, peer_ttl_s=120.0
    )
    async with Node(fast_config(gossip=slow_full)) as b, Node(fast_config(bootstrap=(b.addrs[0],), gossip=slow_full)) as a:
        await a.wait_for_peers(1)
        await b.complete(list(range(300, 364)), max_tokens=1)
        await wait_for(lambda: len(a.router.view.get(b.peer_id).hashes) == 4)
        # Pretend A missed a delta: its copy of B is one version behind.
        state = a.router.view.get(b.peer_id)
        state.version -= 1
        pulls = a.counters.pulls_done
        await b.complete(list(range(500, 564)), max_tokens=1)  # B's next delta no longer lines up
        # The gap makes A pull.
        await wait_for(lambda: a.counters.pulls_done > pulls, 10)
        truth = {h for seq in b.engine.cache.sequences() for h in b.router.hasher.hashes(seq)}
        await wait_for(lambda: a.router.view.get(b.peer_id).hashes == truth, 5)


async def test_a_lost_forward_drops_the_peer_from_the_view_until_it_is_heard_from_again():
    from p2pinfer.core.router import GossipConfig

    # Full digests every 60 s: only a pull brings back B's (true) digest.
    slow_full = GossipConfig(delta_interval_s=0.05, full_interval_s=60.0, load_interval_s=0.2, peer_ttl_s=30.0)
    async with Node(fast_config(gossip=slow_full)) as b, Node(fast_config(bootstrap=(b.addrs[0],), gossip=slow_full)) as a:
        await a.wait_for_peers(1)
        tokens = list(range(3000, 3320))
        forge_claim(a, b.peer_id, tokens)
        b.host.remove_stream_handler(GENERATE_PROTOCOL)  # B still gossips, but no forward reaches it
        result = await a.complete(tokens, max_tokens=1, prefer=b.peer_id)
        assert [att.outcome for att in result.attempts] == ["failed", "done"] and result.served_locally
        # What A believed B caches is gone (a backoff would have kept the forged claim).
        state = a.router.view.get(b.peer_id)
        assert state is None or not set(a.router.hasher.hashes(tokens)) & state.hashes
        # B is heard from again (load report, then a pull of its true digest).
        await wait_for(lambda: b.peer_id in a.router.view and a.router.view.eligible(a.router.view.get(b.peer_id), time.monotonic()), 10)


async def test_a_malformed_pubsub_rpc_resets_that_stream_and_the_node_keeps_serving():
    # py-libp2p 0.8.1 lets a protobuf DecodeError out of pubsub's read loop,
    # which used to stop the whole node (it did, for one node of 32 idle ones).
    from libp2p.custom_types import TProtocol

    async with Node(fast_config()) as b, Node(fast_config(bootstrap=(b.addrs[0],))) as a:
        await a.wait_for_peers(1)
        stream = await a.host.new_stream(ID.from_base58(b.peer_id), [TProtocol("/meshsub/1.1.0")])
        await stream.write(bytes([5]) + b"\xff" * 5)  # a length prefix, then 5 bytes that are no RPC
        await wait_for(lambda: b.counters.gossip_rejected["malformed rpc"] == 1, 5)
        result = await a.complete(list(range(300, 340)), max_tokens=2, prefer=b.peer_id)
        assert result.served_by == b.peer_id and result.generated_tokens == 2
