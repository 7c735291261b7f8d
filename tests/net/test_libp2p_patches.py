"""The runtime patches of py-libp2p (p2pinfer.net.libp2p_patches), on real yamux streams."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from libp2p.custom_types import TProtocol
from libp2p.io.utils import read_exactly
from libp2p.peer.id import ID
from libp2p.stream_muxer.yamux.yamux import YamuxStream

from p2pinfer.net import libp2p_patches
from p2pinfer.lab.node_process import fast_config
from p2pinfer.node import Node

SINK = TProtocol("/p2pinfer-test/sink/1.0.0")


async def test_yamux_credits_a_sender_once_per_half_window_and_never_stalls_it(monkeypatch: pytest.MonkeyPatch) -> None:
    updates: list[tuple[int, int]] = []
    original = YamuxStream.send_window_update

    async def counting(self: Any, increment: int, skip_lock: bool = False) -> None:
        updates.append((id(self), increment))
        await original(self, increment, skip_lock)

    monkeypatch.setattr(YamuxStream, "send_window_update", counting)
    async with Node(fast_config()) as b, Node(fast_config(bootstrap=(b.addrs[0],))) as a:
        assert "yamux window update per half window" in libp2p_patches.applied()
        await a.wait_for_peers(1)
        readers: list[Any] = []
        small_done, big_done = trio.Event(), trio.Event()
        got = bytearray()

        async def sink(stream: Any) -> None:
            readers.append(stream.muxed_stream)
            # Like pubsub: a one-byte length prefix, then the body.
            for _ in range(500):
                n = (await read_exactly(stream, 1))[0]
                got.extend(await read_exactly(stream, n))
            small_done.set()
            while len(got) < 500 * 100 + (1 << 20):
                got.extend(await stream.read(4096))
            big_done.set()
            await stream.close()

        b.host.set_stream_handler(SINK, sink)
        stream = await a.host.new_stream(ID.from_base58(b.peer_id), [SINK])
        with trio.fail_after(30):
            for i in range(500):
                await stream.write(bytes([100]) + bytes([i % 256]) * 100)
            await small_done.wait()
        mine = id(readers[0])
        # 1,000 reads of 50 KB in all: less than half the 256 KiB window, so no update
        # (py-libp2p 0.8.1 as released sends one per read: 1,000 of them).
        assert [u for u in updates if u[0] == mine] == []
        # 1 MiB in one write: four windows' worth. It must get through (the sender is
        # credited as the reader reads) with about one update per 128 KiB read.
        with trio.fail_after(30):
            await stream.write(b"z" * (1 << 20))
            await big_done.wait()
        credited = [inc for sid, inc in updates if sid == mine]
        assert 1 <= len(credited) <= (1 << 20) // (128 << 10) + 2, credited
        assert all(inc >= 128 << 10 for inc in credited), credited
        assert len(got) == 500 * 100 + (1 << 20)
        await stream.close()


async def test_pubsub_builds_the_signed_peer_record_at_most_once_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    """The record pubsub attaches comes from a copy at most ENVELOPE_TTL_S old:
    many RPCs, one address listing; after the TTL a fresh one (a changed address)."""
    import libp2p.pubsub.pubsub as pubsub_mod

    async with Node(fast_config()) as node:
        assert "signed peer record once a second" in libp2p_patches.applied()
        cached = pubsub_mod.env_to_send_in_RPC
        listed = 0
        get_addrs = node.host.get_addrs

        def counting_get_addrs() -> Any:
            nonlocal listed
            listed += 1
            return get_addrs()

        monkeypatch.setattr(node.host, "get_addrs", counting_get_addrs)
        with monkeypatch.context() as frozen:  # time stands still between the calls, then runs again
            clock = [libp2p_patches.time.monotonic() + 60.0]  # past any copy made while the node started
            frozen.setattr(libp2p_patches.time, "monotonic", lambda: clock[0])
            first, _ = cached(node.host)
            for _ in range(50):
                assert cached(node.host)[0] == first
            assert listed == 1
            clock[0] += libp2p_patches.ENVELOPE_TTL_S
            cached(node.host)
            assert listed == 2
        # The original still answers the same record for the same addresses.
        assert cached.original(node.host)[0] == first
