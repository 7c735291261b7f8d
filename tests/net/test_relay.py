"""Circuit relay v2 on loopback: reservations, relayed forwards, limits, what the relay sees.

Nodes that must not be dialled directly *announce* an address where
nothing listens, so the only way to reach them is the relay, as behind a
NAT. Hole punching is off here (on loopback it would just dial directly);
it is tested on the NAT testbed (tests/lab).
"""

from __future__ import annotations

import socket

import trio

from p2pinfer.core.router import GossipConfig
from p2pinfer.net.config import NatConfig
from p2pinfer.lab.node_process import fast_config, wait_for
from p2pinfer.net.wire import encode_request
from p2pinfer.engines.base import GenerationParams
from p2pinfer.node import Node


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Four nodes share one trio loop here: a calmer schedule than fast_config's.
GOSSIP = GossipConfig(delta_interval_s=0.2, full_interval_s=5.0, load_interval_s=1.0, keepalive_interval_s=2.0, peer_ttl_s=8.0)


def relay_config(**nat: object):
    return fast_config(gossip=GOSSIP).replace(nat=NatConfig(relay_service="on", reachability="public", hole_punching=False, **nat))


def hidden_config(relay: Node, *, reserve: bool, **nat_options: object):
    """A node nobody can dial: it announces a closed port (its NAT, in effect)."""
    nat = NatConfig(reachability="private" if reserve else "public", relay_service="off", relays=(relay.addrs[0],),
                    hole_punching=False, **nat_options)
    return fast_config(bootstrap=(relay.addrs[0],), gossip=GOSSIP).replace(
        announce=(f"/ip4/127.0.0.1/tcp/{closed_port()}",), nat=nat
    )


async def seed(holder: Node, others: list[Node], tokens: list[int]) -> None:
    """The holder caches ``tokens``; the others hear of it."""
    await holder.complete(tokens, max_tokens=1, prefer="local")
    blocks = len(tokens) // holder.router.hasher.block_size

    def heard() -> bool:
        return all(
            (s := o.router.view.get(holder.peer_id)) is not None and len(s.hashes) >= blocks for o in others
        )

    await wait_for(heard, 20)


async def test_a_forward_to_a_node_behind_nat_goes_through_its_relay_and_reuses_its_cache():
    async with Node(relay_config()) as r:
        async with Node(hidden_config(r, reserve=True)) as n, Node(hidden_config(r, reserve=False)) as o:
            await wait_for(lambda: len(n.relay_reservations.reservations) == 1, 20)
            assert r.relay.reservations_active() == 1
            # The circuit address travels in N's gossip.
            await wait_for(lambda: o.membership.addrs_of(n.peer_id)[1] == n.relay_reservations.circuit_addrs(), 20)
            prompt = list(range(1000, 1000 + 160))
            await seed(n, [o], prompt)
            relayed_before = r.relay.stats.bytes_relayed
            result = await o.complete(prompt + [7, 8, 9], max_tokens=3, prefer=n.peer_id)
            assert result.served_by == n.peer_id
            assert result.path == "relayed" and result.attempts[0].path == "relayed"
            # The entry counts the forward stream's bytes; the relay carried at least those (encrypted,
            # framed, with whatever gossip went through it meanwhile). Each token id here is 2 bytes or more.
            sent = result.attempts[0].stream_bytes
            assert sent > 2 * len(prompt)
            assert r.relay.stats.bytes_relayed - relayed_before >= sent
            assert result.reused_tokens == result.predicted_reused_tokens == 160
            assert o.paths.path(n.peer_id) == "relayed" and n.paths.path(o.peer_id) == "relayed"
            assert r.relay.stats.bytes_relayed > 0
            status = o.status()
            peer = next(p for p in status["peers"] if p["peer_id"] == n.peer_id)
            assert peer["path"] == "relayed"
            assert status["counters"]["served_by_path"] == {"relayed": 1}


async def test_the_relay_copies_ciphertext_only():
    """The bytes the relay forwards never contain the request's token ids or the answer's text."""
    async with Node(relay_config()) as r:
        captured = bytearray()
        r.relay.taps.append(lambda src, dst, data: captured.extend(data))
        async with Node(hidden_config(r, reserve=True)) as n, Node(hidden_config(r, reserve=False)) as o:
            await wait_for(lambda: o.membership.addrs_of(n.peer_id)[1], 20)
            # Token ids whose protobuf encoding is a long distinctive byte run.
            prompt = [20000 + 37 * i for i in range(200)]
            result = await o.complete(prompt, max_tokens=8, prefer=n.peer_id)
            assert result.path == "relayed" and result.served_by == n.peer_id
            plain = encode_request(
                request_id=b"x" * 16, tokens=prompt, params=GenerationParams(max_tokens=8), hops=1, deadline_ms=1,
                fingerprint=o.router.fingerprint_hex, predicted_match_tokens=0, origin=o.peer_id,
            )
            token_bytes = plain[plain.index(bytes([0xA0, 0x9C, 0x01])):][:64]  # 20000 as a varint, and on
            assert len(token_bytes) == 64 and token_bytes in plain  # the pattern is in the plaintext...
            assert len(captured) > len(plain)  # ...the relay carried at least the request...
            assert token_bytes not in captured  # ...and never saw it
            assert result.text.encode() not in captured or not result.text


async def test_two_origins_to_one_holder_each_keep_their_circuit():
    """py-libp2p's relay keys circuits by peer: a second circuit to a peer clobbered the first."""
    async with Node(relay_config()) as r:
        async with Node(hidden_config(r, reserve=True)) as n:
            async with Node(hidden_config(r, reserve=False)) as o1, Node(hidden_config(r, reserve=False)) as o2:
                await wait_for(lambda: o1.membership.addrs_of(n.peer_id)[1] and o2.membership.addrs_of(n.peer_id)[1], 20)
                for o in (o1, o2):
                    result = await o.complete(list(range(300, 340)), max_tokens=2, prefer=n.peer_id)
                    assert result.path == "relayed", result.attempts
                await wait_for(lambda: len([c for c in r.relay.circuits.values() if c.dst == n.peer_id]) >= 2, 10)
            # o1 and o2 are gone: their circuits ended, and only theirs.
            await wait_for(lambda: not r.relay.circuits, 10)
            async with Node(hidden_config(r, reserve=False)) as o3:
                await wait_for(lambda: o3.membership.addrs_of(n.peer_id)[1], 20)
                assert (await o3.complete(list(range(300, 340)), max_tokens=2, prefer=n.peer_id)).path == "relayed"


async def test_a_relay_refuses_circuits_past_its_per_peer_limit_and_the_request_still_completes():
    async with Node(relay_config(relay_max_circuits_per_peer=1)) as r:
        async with Node(hidden_config(r, reserve=True)) as n:
            # No circuits opened in the background: only the two forwards below.
            quiet = {"reserve": False, "max_relayed_peers": 0}
            async with Node(hidden_config(r, **quiet)) as o1, Node(hidden_config(r, **quiet)) as o2:
                await wait_for(lambda: o1.membership.addrs_of(n.peer_id)[1] and o2.membership.addrs_of(n.peer_id)[1], 20)
                first = await o1.complete(list(range(300, 340)), max_tokens=2, prefer=n.peer_id)
                assert first.path == "relayed"
                # N already has one circuit; the second origin is refused and serves locally.
                await trio.sleep(0.5)
                second = await o2.complete(list(range(300, 340)), max_tokens=2, prefer=n.peer_id)
                assert second.served_locally and second.attempts[0].outcome == "failed"
                assert r.relay.stats.circuits_refused["peer circuit limit"] >= 1


async def run_node(config, stop: trio.Event, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """A node in its own task, so that it can stop before nodes started after it."""
    async with Node(config) as node:
        task_status.started(node)
        await stop.wait()


async def test_reservations_move_when_a_relay_goes():
    async with trio.open_nursery() as nursery, Node(relay_config(relay_reservation_ttl_s=20)) as r2:
        stop_r1 = trio.Event()
        r1 = await nursery.start(run_node, relay_config(), stop_r1)
        cfg = hidden_config(r1, reserve=True)
        cfg = cfg.replace(nat=NatConfig(reachability="private", relay_service="off", relays=(r1.addrs[0], r2.addrs[0]),
                                        hole_punching=False, relay_reservations=1))
        async with Node(cfg) as n:
            await wait_for(lambda: list(n.relay_reservations.reservations) == [r1.peer_id], 20)
            stop_r1.set()  # the relay goes away
            await wait_for(lambda: list(n.relay_reservations.reservations) == [r2.peer_id], 30)
            events = [e["event"] for e in n.relay_reservations.events]
            assert events[:1] == ["reserved"] and "lost" in events and events[-1] == "reserved"
