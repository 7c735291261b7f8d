"""The digest puller's queue: one pull per peer, aimed at the newest reason for it."""

from __future__ import annotations

import trio

from p2pinfer.core import ModelFingerprint, RadixTree, Router
from p2pinfer.net.counters import NodeCounters
from p2pinfer.net.pull import DigestPuller

FP = ModelFingerprint("m", "t", "c")
PROMPT = list(range(1, 16 * 4 + 1))


def _puller_of(router: Router) -> tuple[DigestPuller, list[str]]:
    puller = DigestPuller(
        host=None,  # type: ignore[arg-type]  # pull() is replaced: no stream is opened
        router=router,
        gossip=None,  # type: ignore[arg-type]
        counters=NodeCounters(),
        known_peers=lambda n: [],
        learn=lambda peer, addrs: None,
        timeout_s=1.0,
    )
    pulled: list[str] = []

    async def record(peer_id: str) -> bool:
        pulled.append(peer_id)
        return True

    puller.pull = record  # type: ignore[method-assign]
    return puller, pulled


async def _drain(puller: DigestPuller, wants: list[tuple[int, int]]) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(puller.run)
        for epoch, version in wants:
            puller.want("b", epoch, version, delay_s=0.05)
        with trio.fail_after(5):
            while puller._queued:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()


def _a_holding_b() -> Router:
    a, b = Router("a", FP, RadixTree(), seed=1), Router("b", FP, RadixTree(), seed=2)
    b.cache.insert(PROMPT)
    assert a.on_digest_bytes(b.take_delta() or b"", 1.0) == "applied"
    return a


async def test_a_check_for_a_version_already_held_pulls_nothing() -> None:
    a = _a_holding_b()
    state = a.view.get("b")
    puller, pulled = _puller_of(a)
    await _drain(puller, [(state.epoch, state.version)])
    assert pulled == []


async def test_a_gap_reported_while_an_older_check_waits_is_not_lost() -> None:
    # Seen in CI: a load report at start-up queued a check for v0; the gap
    # found a moment later was deduplicated into it, the check found v0 held,
    # and A waited for B's next keep-alive (10 s) instead of pulling.
    a = _a_holding_b()
    state = a.view.get("b")
    puller, pulled = _puller_of(a)
    await _drain(puller, [(state.epoch, state.version), (state.epoch, state.version + 1)])
    assert pulled == ["b"]


async def test_a_new_epoch_replaces_the_queued_target() -> None:
    a = _a_holding_b()
    state = a.view.get("b")
    puller, pulled = _puller_of(a)
    await _drain(puller, [(state.epoch, state.version), (state.epoch + 1, 0)])
    assert pulled == ["b"]
