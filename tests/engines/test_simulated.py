"""The simulated engine (a cost model with a real radix cache)."""

from __future__ import annotations

import trio
import trio.testing

from p2pinfer.core.costmodel import EngineCostModel
from p2pinfer.engines.base import GenerationParams, GenerationRecord
from p2pinfer.engines.simulated import SimulatedEngine


async def test_load_counts_the_request_in_prefill_and_the_ones_waiting(autojump_clock: trio.testing.MockClock) -> None:
    # On trio's autojump clock the engine's modelled prefill (a trio.sleep) and
    # the test's own sleeps share one virtual time: "50 ms into a 200 ms
    # prefill" holds however slow or fast the machine is.
    engine = SimulatedEngine(cost=EngineCostModel(prefill_ms_per_token=2.0))
    first, second = list(range(1, 101)), list(range(1, 51)) + list(range(500, 530))
    records: list[GenerationRecord] = []

    async def run(tokens: list[int]) -> None:
        async for item in engine.generate(tokens, GenerationParams(max_tokens=1)):
            if isinstance(item, GenerationRecord):
                records.append(item)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run, first)
        await trio.sleep(0.05)  # the first is in its 200 ms prefill
        assert engine.load().queued_prefill_tokens == 100 and engine.load().active_requests == 1
        nursery.start_soon(run, second)
        await trio.sleep(0.05)
        # The second's 50-token prefix is not cached yet, but the first will
        # have cached it when the second starts: only its last 30 tokens count.
        assert engine.load().queued_prefill_tokens == 130
    assert engine.load().queued_prefill_tokens == 0 and engine.load().active_requests == 0
    assert [r.reused_tokens for r in records] == [0, 50]  # once in service, it reused the first's prefix
