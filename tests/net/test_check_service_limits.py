"""The check server's places: one peer cannot take them all (`CheckService.max_in_flight_per_peer`).

The scoring is the simulated engine's (a cost model with a real radix cache), so a
check takes real time and two checks really overlap."""

from __future__ import annotations

import pytest
import trio

from p2pinfer.core.costmodel import EngineCostModel
from p2pinfer.engines.simulated import SimulatedEngine
from p2pinfer.net.check import CheckService
from p2pinfer.net.counters import NodeCounters
from p2pinfer.net.wire import RemoteError, decode_check_response, encode_check_request

PROMPT = list(range(100, 400))
ANSWER = [7, 8, 9, 10]


def service(engine: SimulatedEngine, **limits: int) -> CheckService:
    return CheckService(host=None, engine=engine, fingerprint=engine.fingerprint.hex(),  # type: ignore[arg-type]
                        counters=NodeCounters(), is_busy=lambda: False, distrusted=lambda peer: False, **limits)


async def ask_all(svc: CheckService, peers: list[str]) -> dict[int, object]:
    request = encode_check_request(svc.fingerprint, PROMPT, ANSWER, 1.0)
    results: dict[int, object] = {}

    async def one(i: int, peer: str) -> None:
        await trio.sleep(0.01 * i)  # in this order, each while the first is still scoring
        data = await svc._answer(peer, request)
        try:
            results[i] = decode_check_response(data, ANSWER)
        except RemoteError as exc:
            results[i] = exc

    async with trio.open_nursery() as nursery:
        for i, peer in enumerate(peers):
            nursery.start_soon(one, i, peer)
    return results


@pytest.mark.trio
async def test_a_second_check_of_the_same_peer_is_refused_while_another_peer_is_served() -> None:
    engine = SimulatedEngine(cost=EngineCostModel(prefill_ms_per_token=1.0))  # 300 prompt tokens: about 0.3 s a check
    svc = service(engine)
    results = await ask_all(svc, ["peer-a", "peer-a", "peer-b"])
    assert not isinstance(results[0], RemoteError) and not isinstance(results[2], RemoteError), results
    refused = results[1]
    assert isinstance(refused, RemoteError) and refused.code == "BUSY" and "per peer" in str(refused)
    assert svc.counters.checks_served == 2 and svc.counters.checks_refused["BUSY"] == 1
    assert svc.in_flight == 0 and svc._in_flight_by_peer == {}  # every place given back
    # Once its check is done, the same peer is served again.
    again = await ask_all(svc, ["peer-a"])
    assert not isinstance(again[0], RemoteError)


@pytest.mark.trio
async def test_the_global_limit_still_holds_across_peers() -> None:
    engine = SimulatedEngine(cost=EngineCostModel(prefill_ms_per_token=1.0))
    svc = service(engine, max_in_flight=2, max_in_flight_per_peer=2)
    results = await ask_all(svc, ["peer-a", "peer-b", "peer-c"])
    assert [isinstance(results[i], RemoteError) for i in range(3)] == [False, False, True]
    assert "limit 2" in str(results[2])
