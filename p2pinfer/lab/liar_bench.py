"""``p2pinfer bench liar``: one lying node in a swarm, with and without the defence.

Four node processes on loopback with the simulated engine (the calibrated
cost model, so a cache miss costs what it would cost on the real engine).
Three honest nodes each hold some prefix groups; the fourth node has a
small cache. In the ``liar`` scenario it runs the lab's lying router: it
advertises every prefix it hears of, so origins see it as holding every
group and send it work it serves cold. Requests enter at the honest nodes
only, open loop, at a fixed rate, always at a node that does not hold the
request's group, so each one is routed by the digests.

Scenarios, same seed and request schedule: ``honest`` (the fourth node
tells the truth), ``liar`` (it lies; origins distrust it when realised reuse
falls short of the prediction), ``liar_without_defence`` (it lies; trust
disabled with ``TrustConfig(floor=0)``). They run side by side, one swarm
each, every request sent to every swarm at the same instant, so that the
rest of the machine's load weighs on all of them alike. The *cut-off* is
the last request the liar received in ``liar``; the figures compare mean
time to first token after it with the honest swarm's over the same
requests.

The default policy is the node's default, ``cost``: the liar competes on
its claimed match like a holder, and also on measured RTT and reported
queue, so it stops attracting work once its queue of cold prefills shows.
Under ``paper`` (longest advertised match; ties drawn at random; only the
busy valve looks at load) a lie of equal length wins half the ties until
the origins find it out, and more forwards are in flight to the slow liar
when the first mispredictions come back.
"""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
import random
import time
from typing import Any

from ..stats import mean, percentile, rounded


SCENARIOS = ("honest", "liar", "liar_without_defence")


def _prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(256, 49152) for _ in range(n)]


class LiarSwarm:
    """The four node processes of one scenario."""

    def __init__(
        self,
        scenario: str,
        *,
        prefix_tokens: int,
        suffix_tokens: int,
        speed: float,
        policy: str,
        fourth_cache_tokens: int | None = None,
    ) -> None:
        """``fourth_cache_tokens``: the fourth node's cache (default: about two requests)."""
        from ..core.router import GossipConfig, RouterConfig, TrustConfig
        from ..lab.node_process import NO_CHECK_CACHE, NodeProcess, fast_config

        self.scenario = scenario
        # The default schedule: a node then idles at about 4 % of a core (the
        # 0.1 s / 1 s test schedule costs 14 %), which matters with 12 nodes on 2 cores.
        gossip = GossipConfig()
        trust = TrustConfig(floor=0.0) if scenario == "liar_without_defence" else TrustConfig()
        router = RouterConfig(policy=policy, gossip=gossip, trust=trust)
        common = {
            "speed": speed, "gossip": gossip, "stall_timeout_s": 60.0, "request_timeout_s": 120.0,
            "connect_timeout_s": 10.0,  # the default: opening a stream takes seconds on a starved machine
        }
        # The fourth node caches about two requests: lying costs it nothing, and
        # what it is sent does not stay long enough to make its claims true.
        if fourth_cache_tokens is None:
            fourth_cache_tokens = 2 * (prefix_tokens + suffix_tokens)
        # No check cache: an origin that checks the fourth node's first answers (its
        # probation) would keep the checked prompt and serve its group itself, so the
        # lie would stop attracting work for a reason other than distrust.
        small = {"cache_tokens": fourth_cache_tokens, **NO_CHECK_CACHE}
        self.nodes: list[Any] = []
        first = NodeProcess(fast_config(engine_options=NO_CHECK_CACHE, **common).replace(router=router), f"{scenario}-honest0")
        self.nodes.append(first)
        configs = [fast_config(bootstrap=(first.addr,), engine_options=NO_CHECK_CACHE, **common).replace(router=router)
                   for _ in range(2)]
        configs.append(
            fast_config(bootstrap=(first.addr,), engine_options=small, **common).replace(router=router)
        )
        names = [f"{scenario}-honest1", f"{scenario}-honest2", f"{scenario}-fourth"]
        lying = [False, False, scenario != "honest"]
        with ThreadPoolExecutor(3) as pool:
            futures = [pool.submit(NodeProcess, cfg, name, lying=lie) for cfg, name, lie in zip(configs, names, lying)]
            for fut in futures:
                self.nodes.append(fut.result())
        self.honest, self.x = self.nodes[:3], self.nodes[3]
        self.ids = [n.peer_id for n in self.nodes]

    def meshed(self) -> bool:
        for node in self.nodes:
            view = node.call("view")
            if sum(1 for p in self.ids if p != node.peer_id and view.get(p, {}).get("eligible")) < 3:
                return False
        return True

    def seed(self, requests: list[list[int]]) -> list[Any]:
        """Group g's first request, served cold by honest node g % 3."""
        return [
            self.honest[g % 3].start_call("generate", tokens=tokens, max_tokens=1, prefer="local")
            for g, tokens in enumerate(requests)
        ]

    def learned(self, groups: int, blocks: int) -> bool:
        for i, node in enumerate(self.honest):
            view = node.call("view")
            for j, holder in enumerate(self.honest):
                want = blocks * len(range(j, groups, 3))
                if i != j and view.get(holder.peer_id, {}).get("blocks", 0) < want:
                    return False
            if self.scenario != "honest" and view.get(self.x.peer_id, {}).get("blocks", 0) < blocks * groups:
                return False  # the lie is in place before the first request
        return True

    def close(self) -> None:
        for node in self.nodes:
            node.close()


def workload(
    seed: int, groups: int, prefix_tokens: int, suffix_tokens: int, requests: int
) -> tuple[list[list[int]], list[tuple[int, int, int, list[int]]]]:
    """The first request of each group, then ``(index, group, entry node, tokens)`` per request.

    Group g lives on honest node g % 3; a request for it enters at one of
    the two other honest nodes, so it is routed by the digests.
    """
    rng = random.Random(seed)
    prefixes = [_prompt(rng, prefix_tokens) for _ in range(groups)]
    seeds = [p + _prompt(rng, suffix_tokens) for p in prefixes]
    plan = []
    for i in range(requests):
        g = rng.randrange(groups)
        plan.append((i, g, (g + 1 + i % 2) % 3, prefixes[g] + _prompt(rng, suffix_tokens)))
    return seeds, plan


def run_side_by_side(
    scenarios: tuple[str, ...],
    *,
    groups: int,
    prefix_tokens: int,
    suffix_tokens: int,
    requests: int,
    rate_rps: float,
    speed: float,
    seed: int,
    policy: str = "cost",
    max_tokens: int = 2,
) -> dict[str, dict[str, Any]]:
    """All scenarios at once, each its own swarm, fed the same requests at the same instants.

    Side by side, so that whatever else the machine does weighs on every
    scenario alike. Returns per scenario the request records and the
    nodes' final status.
    """
    from ..lab.node_process import wait_until

    seeds, plan = workload(seed, groups, prefix_tokens, suffix_tokens, requests)
    swarms: dict[str, LiarSwarm] = {}
    try:
        with ThreadPoolExecutor(len(scenarios)) as pool:
            futures = {
                name: pool.submit(
                    LiarSwarm, name, prefix_tokens=prefix_tokens, suffix_tokens=suffix_tokens, speed=speed, policy=policy
                )
                for name in scenarios
            }
            for name, fut in futures.items():
                swarms[name] = fut.result()
        wait_until(lambda: all(s.meshed() for s in swarms.values()), 90, interval_s=0.3, what="every node sees the three others")
        waits = [w for s in swarms.values() for w in s.seed(seeds)]
        for wait in waits:
            wait(120 + 10 * groups)
        blocks = (prefix_tokens + suffix_tokens) // 16
        wait_until(
            lambda: all(s.learned(groups, blocks) for s in swarms.values()),
            60, interval_s=0.3, what="digests of every holder (and the liar's claims) heard",
        )
        t0 = time.monotonic()
        pending: list[tuple[int, int, int, float, dict[str, Any]]] = []
        for i, g, entry, tokens in plan:
            delay = t0 + i / rate_rps - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            sent = time.monotonic() - t0
            calls = {name: s.honest[entry].start_call("generate", tokens=tokens, max_tokens=max_tokens) for name, s in swarms.items()}
            pending.append((i, g, entry, sent, calls))
        out: dict[str, dict[str, Any]] = {name: {"records": [], "ids": s.ids} for name, s in swarms.items()}
        for i, g, entry, sent, calls in pending:
            for name, wait in calls.items():
                ids = swarms[name].ids
                rec: dict[str, Any] = {"i": i, "group": g, "entry": entry, "sent_s": round(sent, 3)}
                try:
                    r = wait(180)
                    targets = [a["target"] for a in r["attempts"]]
                    rec.update(
                        ok=True,
                        ttft_ms=r["ttft_s"] * 1000,
                        served_by=ids.index(r["served_by"]) if r["served_by"] in ids else -1,
                        predicted=r["predicted_reused_tokens"],
                        reused=r["reused_tokens"],
                        tried_x=ids[3] in targets,
                        attempts=len(targets),
                        outcomes=[(a["target"], a["outcome"]) for a in r["attempts"]],
                    )
                except Exception as exc:  # an explicit failure is a figure, not a crash
                    rec.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:300])
                out[name]["records"].append(rec)
        for name, s in swarms.items():
            out[name]["statuses"] = [n.call("status") for n in s.nodes]
        return out
    finally:
        for s in swarms.values():
            s.close()


def summarise(scenario: str, run: dict[str, Any]) -> dict[str, Any]:
    records, statuses, ids = run["records"], run["statuses"], run["ids"]
    x_id = ids[3]
    ok = [r for r in records if r.get("ok")]
    ttft = [r["ttft_ms"] for r in ok]
    to_x = [r for r in ok if r["tried_x"]]
    mispredicted = [r for r in ok if r["served_by"] == 3 and r["predicted"] >= 32 and r["reused"] < r["predicted"]]
    last_to_x = max((r["i"] for r in to_x), default=-1)
    out: dict[str, Any] = {
        "requests": len(records),
        "failed": len(records) - len(ok),
        "mean_ttft_ms": rounded(mean(ttft)),
        "p50_ttft_ms": rounded(percentile(ttft, 50)),
        "p90_ttft_ms": rounded(percentile(ttft, 90)),
        "requests_to_fourth_node": len(to_x),
        "attempts_at_fourth_node_by_outcome": dict(Counter(o for r in ok for t, o in r["outcomes"] if t == x_id)),
        "mispredictions_by_fourth_node": len(mispredicted),
        "last_request_to_fourth_node": last_to_x,
        "fourth_node_forwards_served": statuses[3]["counters"]["forwards_served"],
        "fourth_node_advertised_blocks": statuses[3]["digest"]["blocks"],
        "distrusted_by": sum(1 for s in statuses[:3] if x_id in s["distrusted_peers"]),
        "gossip_score_of_fourth_node": [s["gossip_scores"].get(x_id) for s in statuses[:3]],
        "errors": [r["error"] for r in records if not r.get("ok")][:3],
    }
    return out


def window(run: dict[str, Any], after: int) -> list[float]:
    """TTFTs of the requests sent after request ``after``."""
    return [r["ttft_ms"] for r in run["records"] if r.get("ok") and r["i"] > after]


def run_liar(
    *,
    groups: int = 12,
    prefix_tokens: int = 480,
    suffix_tokens: int = 32,
    requests: int = 120,
    rate_rps: float = 2.0,
    speed: float = 1.0,
    seed: int = 1,
    scenarios: tuple[str, ...] = SCENARIOS,
    policy: str = "cost",
) -> dict[str, Any]:
    from ..core.costmodel import EngineCostModel

    runs = run_side_by_side(
        scenarios, groups=groups, prefix_tokens=prefix_tokens, suffix_tokens=suffix_tokens,
        requests=requests, rate_rps=rate_rps, speed=speed, seed=seed, policy=policy,
    )
    summary = {name: summarise(name, run) for name, run in runs.items()}
    result: dict[str, Any] = {
        "benchmark": "liar",
        "engine": "simulated (calibrated cost model, real radix caches)",
        "cost_model": EngineCostModel().scaled(speed).as_dict(),
        "nodes": "3 honest + 1 (honest, or lying: lab/lying.py); requests enter at the honest nodes",
        "groups": groups,
        "prefix_tokens": prefix_tokens,
        "suffix_tokens": suffix_tokens,
        "requests": requests,
        "rate_rps": rate_rps,
        "seed": seed,
        "policy": policy,
        "scenarios": summary,
    }
    if "liar" in runs:
        cut = summary["liar"]["last_request_to_fourth_node"]
        result["cutoff_request"] = cut
        result["requests_after_cutoff"] = requests - 1 - cut
        after = {name: window(run, cut) for name, run in runs.items()}
        result["mean_ttft_ms_after_cutoff"] = {name: rounded(mean(v)) for name, v in after.items()}
        result["p50_ttft_ms_after_cutoff"] = {name: rounded(percentile(v, 50)) for name, v in after.items()}
        means, p50s = result["mean_ttft_ms_after_cutoff"], result["p50_ttft_ms_after_cutoff"]
        if "honest" in runs and means.get("honest") and means.get("liar") is not None:
            ratio = means["liar"] / means["honest"]
            result["ttft_ratio_liar_to_honest_after_cutoff"] = round(ratio, 3)
            result["p50_ratio_liar_to_honest_after_cutoff"] = round(p50s["liar"] / p50s["honest"], 3)
            result["within_10_percent"] = abs(ratio - 1.0) <= 0.10
    return result
