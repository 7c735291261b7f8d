"""Processor sharing among nodes of one machine (p2pinfer/sim/cpu.py)."""

from __future__ import annotations

import heapq
import itertools
from typing import Any

import pytest

from p2pinfer.sim.cpu import SharedCpu
from p2pinfer.sim.simulator import SimConfig, Simulator


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.heap: list[tuple[float, int, Any, tuple[Any, ...]]] = []
        self.seq = itertools.count()

    def at(self, t: float, fn: Any, *args: Any) -> None:
        heapq.heappush(self.heap, (t, next(self.seq), fn, args))

    def run(self) -> None:
        while self.heap:
            t, _, fn, args = heapq.heappop(self.heap)
            self.now = t
            fn(*args)


def _cpu(cores: float) -> tuple[Clock, SharedCpu, dict[str, float]]:
    clock = Clock()
    return clock, SharedCpu(cores, clock.at, lambda: clock.now), {}


def test_jobs_within_the_core_count_run_at_full_speed() -> None:
    clock, cpu, done = _cpu(2)
    for name in ("a", "b"):
        cpu.start(name, 3.0, lambda n=name: done.__setitem__(n, clock.now))
    clock.run()
    assert done == {"a": 3.0, "b": 3.0}


def test_more_jobs_than_cores_share_them() -> None:
    clock, cpu, done = _cpu(1)
    cpu.start("a", 2.0, lambda: done.__setitem__("a", clock.now))
    cpu.start("b", 1.0, lambda: done.__setitem__("b", clock.now))
    clock.run()
    # Both at half speed until b finishes its 1 s of work at t=2; a then has 1 s left alone.
    assert done["b"] == pytest.approx(2.0) and done["a"] == pytest.approx(3.0)


def test_a_late_job_slows_the_running_one_and_cancel_speeds_it_up() -> None:
    clock, cpu, done = _cpu(1)
    cpu.start("a", 4.0, lambda: done.__setitem__("a", clock.now))
    clock.at(1.0, lambda: cpu.start("b", 10.0, lambda: done.__setitem__("b", clock.now)))
    clock.at(3.0, lambda: cpu.cancel("b"))  # b's node leaves
    clock.run()
    # a: 1 s alone, 2 s at half speed (1 s of work), then 2 s alone again.
    assert done == {"a": pytest.approx(5.0)}
    assert cpu.running() == 0


def test_one_job_per_owner_and_positive_cores() -> None:
    clock, cpu, _ = _cpu(1)
    cpu.start("a", 1.0, lambda: None)
    with pytest.raises(ValueError, match="one job at a time"):
        cpu.start("a", 1.0, lambda: None)
    with pytest.raises(ValueError):
        SharedCpu(0, clock.at, lambda: clock.now)


# -- in the simulator ---------------------------------------------------------


def _run(config: SimConfig, built: Any) -> tuple[Simulator, dict[str, Any]]:
    reqs, encoder, info = built
    sim = Simulator(config, reqs, encoder, workload=info)
    return sim, sim.run()


def test_enough_cores_change_nothing(mmlu_300: Any) -> None:
    _, built = mmlu_300
    alone = _run(SimConfig(policy="local", seed=7), built)[1]
    shared = _run(SimConfig(policy="local", seed=7, shared_cores=4), built)[1]
    assert shared["ttft_ms"]["mean"] == pytest.approx(alone["ttft_ms"]["mean"], rel=1e-6)


def test_fewer_cores_than_busy_nodes_slow_everyone(mmlu_300: Any) -> None:
    _, built = mmlu_300
    # Without the admission touch (issue 22), so that the cache sees the same
    # requests in the same order: with it, longer queues (a slower CPU) touch
    # more queued prefixes, and the LRU, so the hit rate, rightly changes.
    alone = _run(SimConfig(policy="local", seed=7, touch_on_admit=False), built)[1]
    shared = _run(SimConfig(policy="local", seed=7, shared_cores=1, touch_on_admit=False), built)[1]
    assert shared["ttft_ms"]["mean"] > 1.5 * alone["ttft_ms"]["mean"]
    assert shared["hit_rate"] == alone["hit_rate"]  # same work, only slower


@pytest.mark.parametrize("policy", ["cost", "paper"])
def test_shared_cores_conserve_requests_under_churn(mmlu_300: Any, policy: str) -> None:
    _, built = mmlu_300
    config = SimConfig(nodes=5, policy=policy, shared_cores=2, churn_interval_s=20.0, rejoin_delay_s=3.0, seed=7)
    sim, result = _run(config, built)
    assert sorted(r.rid for r in sim.completed) == list(range(len(built[0])))
    assert not sim.pending and result["churn"]["leaves"] >= 3
    assert sim.cpu is not None and sim.cpu.running() == 0  # nothing left computing


def test_closed_loop_keeps_the_concurrency_and_serves_everyone(mmlu_300: Any) -> None:
    _, built = mmlu_300
    config = SimConfig(policy="cost", seed=7, concurrency=3, shared_cores=2, churn_interval_s=30.0, rejoin_delay_s=3.0)
    reqs, encoder, info = built
    sim = Simulator(config, reqs, encoder, workload=info)
    most = 0
    real_arrive = sim._arrive

    def arrive(i: int) -> None:
        nonlocal most
        real_arrive(i)
        most = max(most, len(sim.pending))

    sim._arrive = arrive  # type: ignore[method-assign]
    result = sim.run()
    assert sorted(r.rid for r in sim.completed) == list(range(len(reqs)))
    assert most == 3  # never more in flight than the client allows
    assert result["params"]["arrivals"] == "closed loop, 3 in flight"
    again = _run(config, built)[1]
    assert again["ttft_ms"] == result["ttft_ms"]  # deterministic for a seed


def test_reported_speed_follows_the_slowdown_like_a_live_engine(mmlu_300: Any) -> None:
    _, built = mmlu_300
    full = SimConfig().cost.prefill_ms_per_token
    alone, _ = _run(SimConfig(policy="local", seed=7), built)
    assert all(n.load().prefill_ms_per_token == pytest.approx(full) for n in alone.nodes)  # nothing ran beside it
    shared, _ = _run(SimConfig(policy="local", seed=7, shared_cores=1), built)
    reported = [n.load().prefill_ms_per_token for n in shared.nodes]
    # Four nodes on one core: prefills ran beside others, and the EWMA of the
    # measured speed (what peers route by) says so, unevenly.
    assert all(r > full for r in reported) and max(reported) <= 4 * full + 1e-9
    assert len(set(reported)) > 1
