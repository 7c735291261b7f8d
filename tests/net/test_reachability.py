"""Reachability by dial-back over a fresh connection, and why not py-libp2p's AutoNAT.

All on loopback, in one process: a loopback address is a LAN address, so
the verdicts here are ``lan`` (proved, but deciding nothing); the public
and private verdicts are checked on the NAT testbed (tests/lab).
"""

from __future__ import annotations

import socket

from libp2p.peer.id import ID
import trio

from p2pinfer.net.connections import connections_of
from p2pinfer.net.framing import FrameReader, finish_stream, write_frame
from p2pinfer.net.reachability import REACHABILITY_PROTOCOL, is_lan_ip
from p2pinfer.lab.node_process import fast_config, wait_for
from p2pinfer.net.wire import DIALBACK_MAX_BYTES, encode_dialback_response
from p2pinfer.node import Node


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_dial_back_comes_over_a_fresh_connection_that_is_closed_afterwards():
    async with Node(fast_config()) as b, Node(fast_config(bootstrap=(b.addrs[0],))) as a:
        await a.wait_for_peers(1)
        await wait_for(lambda: len(connections_of(a.host, b.peer_id)) == 1)
        original = connections_of(a.host, b.peer_id)[0]
        answer, proved = await a.reachability.exchange(b.peer_id, [a.addrs[0].split("/p2p/")[0]])
        assert answer.status == "ok" and proved
        assert answer.observed_ip == "127.0.0.1"
        # The server closed its dial-back connection; the original one is untouched.
        await wait_for(lambda: connections_of(a.host, b.peer_id) == [original], 10)
        result = await a.complete(list(range(100, 140)), max_tokens=2, prefer=b.peer_id)
        assert result.served_by == b.peer_id
        # A loopback dial-back proves only that the LAN reaches us.
        assert a.reachability._judge(answer, proved)[0] == "lan"


async def test_an_unreachable_address_is_reported_failed():
    async with Node(fast_config()) as b, Node(fast_config(bootstrap=(b.addrs[0],))) as a:
        await a.wait_for_peers(1)
        answer, proved = await a.reachability.exchange(b.peer_id, [f"/ip4/127.0.0.1/tcp/{closed_port()}"])
        assert answer.status == "failed" and not proved


async def test_a_server_that_reuses_the_existing_connection_is_not_believed():
    """What py-libp2p's AutoNAT v1 server does (``host.connect`` returns the open connection)."""
    async with Node(fast_config()) as b, Node(fast_config(bootstrap=(b.addrs[0],))) as a:
        await a.wait_for_peers(1)

        async def reusing_server(stream):
            await FrameReader(stream).read_frame(DIALBACK_MAX_BYTES)
            peer = stream.muxed_conn.peer_id
            from libp2p.peer.peerinfo import PeerInfo

            await b.host.connect(PeerInfo(peer, []))  # "dials back": returns the existing connection
            await write_frame(stream, encode_dialback_response("ok", addr=a.addrs[0], observed_ip="127.0.0.1"))
            await finish_stream(stream, True)

        b.host.set_stream_handler(REACHABILITY_PROTOCOL, reusing_server)
        before = a.counters.reachability_untrusted
        result, detail = await a.reachability.ask(b.peer_id)
        assert result == "untrusted", detail
        assert a.counters.reachability_untrusted == before + 1
        assert a.reachability.status == "unknown"


async def test_py_libp2p_autonat_reports_an_unreachable_address_as_dialled():
    """The flaw this module exists for, shown on py-libp2p 0.8.1 itself.

    Its AutoNAT server "dials" the requester with ``host.connect``, which
    returns the connection the request came on: it answers OK for an
    address where nothing listens. Our server, asked the same, says failed.
    """
    from libp2p.host.autonat.autonat import AutoNATService
    from libp2p.host.autonat.pb.autonat_pb2 import Message
    import multiaddr

    async with Node(fast_config()) as b, Node(fast_config(bootstrap=(b.addrs[0],))) as a:
        await a.wait_for_peers(1)
        AutoNATService(b.host, serve=True)  # py-libp2p's server, on B
        client = AutoNATService(a.host, serve=False)
        nowhere = multiaddr.Multiaddr(f"/ip4/127.0.0.1/tcp/{closed_port()}")
        with trio.fail_after(30):
            status, _addr = await client.query_server(ID.from_base58(b.peer_id), addrs=[nowhere.to_bytes()])
        assert status == Message.OK  # py-libp2p: "reachable"
        answer, proved = await a.reachability.exchange(b.peer_id, [str(nowhere)])
        assert answer.status == "failed" and not proved  # ours: not reachable


def test_lan_addresses_decide_nothing():
    for ip in ("10.1.2.3", "172.20.0.1", "192.168.10.2", "100.64.0.9", "127.0.0.1", "169.254.1.1", "::1", "fd00::1"):
        assert is_lan_ip(ip), ip
    # The NAT testbed's WAN (TEST-NET-2) and any internet address are not LAN addresses.
    for ip in ("198.51.100.10", "8.8.8.8", "2001:db8::1"):
        assert not is_lan_ip(ip), ip


async def test_after_one_lan_answer_lan_peers_are_not_asked_again():
    """A peer that reaches us over a LAN address can only answer ``lan``: once
    one has, a LAN (here loopback) swarm stops dialling itself back, while a
    node with no verdict yet still asks."""
    async with Node(fast_config()) as b, Node(fast_config(bootstrap=(b.addrs[0],))) as c, \
            Node(fast_config(bootstrap=(b.addrs[0],))) as a:
        await wait_for(lambda: {b.peer_id, c.peer_id} <= set(a.reachability._candidates()), 10)
        a.reachability.verdicts.clear()
        assert {b.peer_id, c.peer_id} <= set(a.reachability._candidates())
        assert await a.reachability.check() == "unknown"
        asked = sum(a.counters.reachability_checks.values())
        assert asked >= 1 and any(v.result == "lan" for v in a.reachability.verdicts.values())
        assert a.reachability._candidates() == []
        await a.reachability.check()  # nobody left to ask: no dial-back
        assert sum(a.counters.reachability_checks.values()) == asked
