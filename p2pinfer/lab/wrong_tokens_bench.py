"""``p2pinfer bench liar --scenario wrong-tokens`` (and ``other-model``): a peer that returns wrong tokens.

Four real llama.cpp node processes (SmolLM2-135M-Instruct) on loopback, the
MMLU five-shot workload. Each subject's header is first served, and so
cached, by node ``g % 4``; every request then enters at a node that does not
hold its subject, so it is routed by the digests, and answers ``max_tokens``
greedy tokens.

* ``wrong-tokens`` / ``other-model`` / ``truncated-precision``: node 3 serves
  with the lab's :class:`~p2pinfer.lab.wrong_tokens.WrongTokenEngine` (random
  tokens; the second test model's answer, Gemma 3 270M, re-tokenised; or the
  claimed model's answer with its weights cut to 2 bits), requests enter at
  the three honest nodes one at a time, the subjects in turn. Node 3 holds
  subjects 3, 7, 11...; the first request of the liar's k-th subject enters
  at origin ``k % 3``, so with 12 subjects or more every origin's first
  request for a subject only the liar holds meets the liar (a rejected
  request is finished by an honest node, which then holds that subject too).
  Reported: the answers the liar gave before every honest node had
  distrusted it (``requests_to_liar_before_distrust``), how many of its
  tokens reached a client, and whether it got any traffic afterwards.
* the cost (always run with either): two honest swarms side by side, fed the
  same requests at once with ``concurrency`` in flight each: one with the
  default verification (``verify_fraction`` 0.1 and probation), one with none.
  First a probation phase takes every peer through every origin's probation
  (``probation_answers`` requests per origin and peer, sent to that peer with
  ``prefer``; its one-time cost is reported as ``probation``), then a warm-up
  of random draws, then the measured requests: their throughput ratio is
  ``verification_throughput_cost``, the steady-state cost of spot checks at
  ``verify_fraction``. Every failed check of an honest peer, in any swarm, is
  a false accusation.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
import random
import threading
import time
from typing import Any

from ..stats import median, rounded

WRONG_SCENARIOS = ("wrong-tokens", "other-model", "truncated-precision")
MODES = {"wrong-tokens": "random", "other-model": "other-model", "truncated-precision": "truncated-precision"}


def _node_config(bootstrap: tuple[str, ...], verify: Any, threads: int) -> Any:
    from ..core.router import GossipConfig, RouterConfig
    from .node_process import fast_config

    gossip = GossipConfig()
    cfg = fast_config(bootstrap=bootstrap, gossip=gossip, stall_timeout_s=60.0, request_timeout_s=300.0, connect_timeout_s=10.0)
    return cfg.replace(
        engine="llama-cpp",
        engine_options={"threads": threads, "context_size": 4096, "cache_tokens": 32768},
        router=RouterConfig(gossip=gossip, verify=verify),
    )


class Swarm:
    """Four llama.cpp node processes; ``wrong`` makes node 3 return wrong tokens."""

    def __init__(self, name: str, verify: Any, *, wrong: str | None = None, threads: int = 1) -> None:
        from .node_process import NodeProcess

        self.name = name
        first = NodeProcess(_node_config((), verify, threads), f"{name}-0", start_timeout_s=180)
        self.nodes = [first]
        try:
            with ThreadPoolExecutor(3) as pool:
                futs = [
                    pool.submit(NodeProcess, _node_config((first.addr,), verify, threads), f"{name}-{i}",
                                start_timeout_s=180, wrong_tokens=wrong if i == 3 else None)
                    for i in (1, 2, 3)
                ]
                self.nodes += [f.result() for f in futs]
        except BaseException:
            self.close()
            raise
        self.ids = [n.peer_id for n in self.nodes]

    def meshed(self) -> bool:
        for node in self.nodes:
            view = node.call("view")
            if sum(1 for p in self.ids if p != node.peer_id and view.get(p, {}).get("eligible")) < 3:
                return False
        return True

    def close(self) -> None:
        for n in self.nodes:
            n.close()


def _prompts(subjects: int, requests: int, seed: int, round_robin: bool = False) -> tuple[list[str], list[tuple[int, str]]]:
    """Each subject's seeding prompt, then ``(subject, prompt)`` per request: subjects drawn
    uniformly, or (``round_robin``) in turn, so that every origin meets the liar's subject soon."""
    from ..workloads.mmlu import MMLUWorkload, load_mmlu

    work = MMLUWorkload(load_mmlu()[:subjects], seed=seed)
    rng = random.Random(seed)
    seeds = ["".join(work.prompt(g, 0).parts) for g in range(subjects)]
    plan = []
    for i in range(requests):
        if round_robin:
            g = i % subjects
            p = work.prompt(g, 1 + i // subjects)
        else:
            p = work.draw(rng)
            g = next(k for k, s in enumerate(work.subjects) if s.name == p.label)
        plan.append((g, "".join(p.parts)))
    return seeds, plan


def _seed(swarm: Swarm, seeds: list[str]) -> None:
    """Subject g's header into node g % 4's cache (served there)."""
    waits = [swarm.nodes[g % 4].start_call("generate", prompt=text, max_tokens=1, prefer="local") for g, text in enumerate(seeds)]
    for w in waits:
        w(600)


def _learned(swarm: Swarm, subjects: int) -> bool:
    for i, node in enumerate(swarm.nodes):
        view = node.call("view")
        for j in range(4):
            if j != i and any(g % 4 == j for g in range(subjects)) and view.get(swarm.ids[j], {}).get("blocks", 0) < 8:
                return False
    return True


def _probation_plan(subjects: int, seed: int, answers: int) -> list[tuple[int, int, str]]:
    """``(entry, peer, prompt)``: ``answers`` requests from every node to every other, each for a
    subject the peer holds (subject ``peer``), in a choice order (variant 23) the random draws of a
    short run do not reach, so the probation phase leaves the later phases' prompts uncached."""
    from ..workloads.mmlu import MMLUWorkload, load_mmlu

    work = MMLUWorkload(load_mmlu()[:subjects], seed=seed)
    return [
        (e, j, "".join(work.prompt(j, 3 * (e * answers + k), 23).parts))
        for k in range(answers) for e in range(4) for j in range(4) if j != e
    ]


def _verification_totals(statuses: list[dict[str, Any]]) -> dict[str, float]:
    """The /status verification counters that the cost figures difference, summed over a swarm."""
    keys = ("tokens_checked", "check_seconds", "spot_checks_drawn", "spot_checks_over_budget", "spot_check_tokens", "served_tokens")
    out = {k: sum(st["verification"][k] for st in statuses) for k in keys}
    out["checks"] = sum(sum(st["verification"]["checks"].values()) for st in statuses)
    # Spot checks sent to a third peer holding the prefix, any outcome (fallbacks included).
    out["checks_delegated"] = sum(sum(st["verification"].get("checks_delegated", {}).values()) for st in statuses)
    out["check_tokens_served_for_peers"] = sum(st["verification"].get("check_tokens_served_for_peers", 0) for st in statuses)
    return out


def _entry(g: int, i: int, entries: tuple[int, ...]) -> int:
    choices = [e for e in entries if e != g % 4]
    return choices[i % len(choices)]


def _accusations(statuses: list[dict[str, Any]], honest_ids: set[str], records: list[dict[str, Any]]) -> int:
    """Failed checks of honest peers' answers."""
    return sum(
        1 for r in records for a in r.get("attempts", ())
        if a["target"] in honest_ids and a.get("check") in ("rejected", "failed_after_streaming")
    )


def _shown(records: list[dict[str, Any]], peer: str) -> int:
    """Tokens of ``peer``'s answers that reached a client: all of an answer not
    rejected, and of a rejected one the verified tokens the next attempt
    continued from (none when the request then failed)."""
    shown = 0
    for r in records:
        attempts = r.get("attempts", ())
        for k, a in enumerate(attempts):
            if a["target"] != peer:
                continue
            if a.get("check") != "rejected":
                shown += a["generated_tokens"]
            elif k + 1 < len(attempts) and r.get("ok"):
                shown += attempts[k + 1]["resumed_tokens"] - a["resumed_tokens"]
    return shown


def run_liar_scenario(scenario: str, *, subjects: int, requests: int, max_tokens: int, seed: int, threads: int) -> dict[str, Any]:
    from ..core.verify import VerifyConfig
    from .node_process import wait_until

    seeds, plan = _prompts(subjects, requests, seed, round_robin=True)
    swarm = Swarm(scenario, VerifyConfig(), wrong=MODES[scenario], threads=threads)
    try:
        wait_until(swarm.meshed, 120, interval_s=0.3, what="every node sees the three others")
        _seed(swarm, seeds)
        wait_until(lambda: _learned(swarm, subjects), 60, interval_s=0.3, what="every holder's digest heard")
        liar = swarm.ids[3]
        honest = swarm.nodes[:3]
        records: list[dict[str, Any]] = []
        t0 = time.monotonic()
        for i, (g, text) in enumerate(plan):
            # A subject's successive requests enter at each origin in turn, the liar's k-th subject first at origin k % 3.
            entry = _entry(g, i // subjects + g // 4, (0, 1, 2))
            rec: dict[str, Any] = {"i": i, "group": g, "entry": entry}
            try:
                r = honest[entry].call("generate", prompt=text, max_tokens=max_tokens, timeout_s=600)
                rec.update(ok=True, served_by=swarm.ids.index(r["served_by"]) if r["served_by"] in swarm.ids else -1,
                           attempts=r["attempts"])
            except Exception as exc:  # an explicit failure is a figure
                rec.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:300])
            records.append(rec)
        # An origin has distrusted the liar from the request in which one of its checks failed
        # (read from the attempts, not from /status: a sanction lasts distrust_s, shorter than a slow run).
        caught: set[int] = set()
        cut = None
        for rec in records:
            if any(a["target"] == liar and a.get("check") in ("rejected", "failed_after_streaming") for a in rec.get("attempts", ())):
                caught.add(rec["entry"])
            if cut is None and caught == {0, 1, 2}:
                cut = rec["i"]
        to_liar_before = None if cut is None else sum(
            1 for r in records if r["i"] <= cut for a in r.get("attempts", ()) if a["target"] == liar)
        wall = time.monotonic() - t0
        statuses = [n.call("status") for n in swarm.nodes]
        liar_attempts = [a for r in records for a in r.get("attempts", ()) if a["target"] == liar]
        after = [a for r in records if cut is not None and r["i"] > cut for a in r.get("attempts", ()) if a["target"] == liar]
        return {
            "wrong_token_mode": MODES[scenario],
            "requests": len(records),
            "failed": sum(1 for r in records if not r.get("ok")),
            "wall_s": round(wall, 1),
            "requests_to_liar_before_distrust": to_liar_before,
            "origins_that_caught_it": sorted(caught),
            "distrusted_by_at_end": sum(1 for s in statuses[:3] if liar in s["distrusted_peers"]),
            "request_at_which_all_distrusted": cut,
            "requests_to_liar_after_distrust": len(after),
            "liar_answers_by_check": {k: sum(1 for a in liar_attempts if a.get("check") == k) for k in
                                      ("rejected", "failed_after_streaming", "passed", "error", "")},
            "liar_tokens_generated": sum(a["generated_tokens"] for a in liar_attempts),
            "liar_tokens_shown_to_clients": _shown(records, liar),
            "served_by_liar": sum(1 for r in records if r.get("served_by") == 3),
            "false_accusations": _accusations(statuses, set(swarm.ids[:3]), records),
            "liar_forwards_served": statuses[3]["counters"]["forwards_served"],
            "checks_by_node": [s["verification"]["checks"] for s in statuses[:3]],
            "gossip_score_of_liar": [s["gossip_scores"].get(liar) for s in statuses[:3]],
            "errors": [r["error"] for r in records if not r.get("ok")][:3],
        }
    finally:
        swarm.close()


def run_cost(*, subjects: int, requests: int, warmup: int, max_tokens: int, seed: int, concurrency: int,
             threads: int, verify_fraction: float = 0.1, verify_delegate: bool = True) -> dict[str, Any]:
    """Two honest swarms side by side: verification at ``verify_fraction`` (and probation) against none.
    ``verify_delegate``: whether the checked swarm's spot checks may go to a third peer holding the prefix.

    Three phases, each fed to both swarms at once: ``probation`` (every origin's probation of
    every peer, a one-time cost per pair of nodes), ``warmup`` (random draws), ``measured``. The
    cost figures of the measured phase are differences of /status counters read around it."""
    from ..core.verify import VerifyConfig
    from .node_process import wait_until

    seeds, plan = _prompts(subjects, warmup + requests, seed)
    verify_on = VerifyConfig(fraction=verify_fraction, delegate=verify_delegate)
    configs = {"verify_default": verify_on, "verify_off": VerifyConfig(fraction=0.0, probation_answers=0)}
    swarms: dict[str, Swarm] = {}
    try:
        with ThreadPoolExecutor(2) as pool:
            futs = {k: pool.submit(Swarm, f"cost-{k}", v, threads=threads) for k, v in configs.items()}
            for k, f in futs.items():
                swarms[k] = f.result()
        wait_until(lambda: all(s.meshed() for s in swarms.values()), 120, interval_s=0.3, what="full meshes")
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda s: _seed(s, seeds), swarms.values()))
        wait_until(lambda: all(_learned(s, subjects) for s in swarms.values()), 60, interval_s=0.3, what="digests heard")

        def drive(swarm: Swarm, items: list[tuple[int, int, str, int | None]]) -> tuple[float, list[dict[str, Any]]]:
            """Closed loop, ``concurrency`` in flight; ``(i, entry, prompt, preferred node or None)``
            per request; returns the wall time and records."""
            lock = threading.Lock()
            queue = list(items)
            records: list[dict[str, Any]] = []

            def worker() -> None:
                while True:
                    with lock:
                        if not queue:
                            return
                        i, entry, text, prefer = queue.pop(0)
                    rec: dict[str, Any] = {"i": i}
                    extra = {} if prefer is None else {"prefer": swarm.ids[prefer]}
                    try:
                        r = swarm.nodes[entry].call("generate", prompt=text, max_tokens=max_tokens, timeout_s=600, **extra)
                        rec.update(ok=True, attempts=r["attempts"], total_s=r["total_s"])
                    except Exception as exc:
                        rec.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:300])
                    with lock:
                        records.append(rec)

            t = time.monotonic()
            with ThreadPoolExecutor(concurrency) as pool:
                for f in [pool.submit(worker) for _ in range(concurrency)]:
                    f.result()
            return time.monotonic() - t, records

        probation = [(-1 - n, e, text, j) for n, (e, j, text) in enumerate(_probation_plan(subjects, seed, verify_on.probation_answers))]
        indexed = [(i, _entry(g, i, (0, 1, 2, 3)), text, None) for i, (g, text) in enumerate(plan)]
        phases: dict[str, dict[str, Any]] = {}
        snapshots: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for phase, items in (("probation", probation), ("warmup", indexed[:warmup]), ("measured", indexed[warmup:])):
            snapshots[phase] = {k: [n.call("status") for n in s.nodes] for k, s in swarms.items()}
            with ThreadPoolExecutor(2) as pool:
                futs = {k: pool.submit(drive, s, items) for k, s in swarms.items()}
                phases[phase] = {k: f.result() for k, f in futs.items()}
        statuses = {k: [n.call("status") for n in s.nodes] for k, s in swarms.items()}
        after = {"probation": snapshots["warmup"], "warmup": snapshots["measured"], "measured": statuses}
        out: dict[str, Any] = {"probation_requests": len(probation), "warmup_requests": warmup, "measured_requests": requests,
                               "concurrency": concurrency, "verify_fraction": verify_fraction, "verify_budget": verify_on.budget,
                               "verify_delegate": verify_delegate,
                               "probation_answers": verify_on.probation_answers}
        for k, s in swarms.items():
            all_records = [r for phase in phases.values() for r in phase[k][1]]
            out[k] = {"false_accusations": _accusations(statuses[k], set(s.ids), all_records),
                      "errors": [r["error"] for r in all_records if not r.get("ok")][:3]}
            for phase, per_swarm in phases.items():
                wall, records = per_swarm[k]
                ok = [r for r in records if r.get("ok")]
                begin, end = _verification_totals(snapshots[phase][k]), _verification_totals(after[phase][k])
                out[k][phase] = {
                    "wall_s": round(wall, 2),
                    "throughput_rps": round(len(ok) / wall, 4) if wall > 0 else None,
                    "median_total_s": rounded(median([r["total_s"] for r in ok])) if ok else None,
                    "failed": len(records) - len(ok),
                    "answers_checked": sum(1 for r in records for a in r.get("attempts", ()) if a.get("check")),
                    **{key: round(end[key] - begin[key], 2) for key in end},
                }
            out[k]["peers_past_probation"] = [st["verification"]["peers_past_probation"] for st in snapshots["warmup"][k]]
        measured = {k: out[k]["measured"]["throughput_rps"] for k in swarms}
        on, off = measured["verify_default"], measured["verify_off"]
        out["verification_throughput_cost"] = round(1 - on / off, 4) if on and off else None
        prob = {k: out[k]["probation"]["wall_s"] for k in swarms}
        out["probation_wall_cost_s"] = round(prob["verify_default"] - prob["verify_off"], 2)
        out["honest_checks_total"] = _verification_totals(statuses["verify_default"])["checks"]
        return out
    finally:
        for s in swarms.values():
            s.close()


def run_wrong_tokens(
    scenarios: tuple[str, ...], *, subjects: int = 12, requests: int = 40, cost_requests: int = 120, warmup: int = 20,
    max_tokens: int = 8, seed: int = 1, concurrency: int = 4, threads: int = 1, with_cost: bool = True,
    verify_fraction: float = 0.1, verify_delegate: bool = True,
) -> dict[str, Any]:
    result: dict[str, Any] = {
        "benchmark": "liar (wrong tokens)",
        "engine": ("llama-cpp (real), SmolLM2-135M-Instruct Q4_1; other-model liar: Gemma 3 270M Q4_K_M re-tokenised; "
                   "truncated-precision liar: SmolLM2 with its Q4_1 weights cut to 2 bits (lab/wrong_tokens.py)"),
        "workload": f"MMLU five-shot, {subjects} subjects, {max_tokens} greedy tokens per answer",
        "nodes": "4 processes; node 3 returns wrong tokens (lab/wrong_tokens.py); requests enter at nodes not holding the subject",
        "threads_per_node": threads,
        "seed": seed,
        "scenarios": {},
    }
    for sc in scenarios:
        result["scenarios"][sc] = run_liar_scenario(sc, subjects=subjects, requests=requests, max_tokens=max_tokens,
                                                    seed=seed, threads=threads)
    if with_cost:
        result["cost"] = run_cost(subjects=subjects, requests=cost_requests, warmup=warmup, max_tokens=max_tokens,
                                  seed=seed + 1, concurrency=concurrency, threads=threads, verify_fraction=verify_fraction,
                                  verify_delegate=verify_delegate)
        result["verification_throughput_cost"] = result["cost"]["verification_throughput_cost"]
    for sc, r in result["scenarios"].items():
        result.setdefault("requests_to_liar_before_distrust", {})[sc] = r["requests_to_liar_before_distrust"]
    result["false_accusations"] = sum(r["false_accusations"] for r in result["scenarios"].values()) + (
        result["cost"]["verify_default"]["false_accusations"] + result["cost"]["verify_off"]["false_accusations"]
        if with_cost else 0
    )
    return result
