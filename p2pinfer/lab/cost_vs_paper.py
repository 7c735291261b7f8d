"""``p2pinfer simulate experiment cost-vs-paper``: the guard that ``cost``
never loses to the paper's longest-match policy (issue 22).

Both policies (and the oracle, as the limit) run on the *same* requests:
``bench swarm``'s workload (MMLU five-shot, 8 subjects, one output token,
random entry nodes, a closed loop of N requests in flight) with its cache
pressure (:func:`~p2pinfer.lab.live_experiment.default_cache_budget`),
replayed through the simulator as ``bench swarm-replay`` does. Cells: node
count x machines (every node on this benchmark box's 2 shared cores, or a
machine per node) x one-way delay per hop x requests in flight; seeds
paired. A cell fails when ``cost``'s mean TTFT exceeds ``paper``'s by more
than two standard errors of the paired per-seed differences.
"""

from __future__ import annotations

from collections.abc import Callable
import itertools
import math
from pathlib import Path
import statistics
from typing import Any

from ..core.costmodel import EngineCostModel
from ..stats import mean

__all__ = ["GRID", "QUICK_GRID", "LIVE_ENGINE", "cost_vs_paper"]

Progress = Callable[[str, int, int], None]

LIVE_ENGINE = EngineCostModel(
    prefill_ms_per_token=4.58,
    decode_ms_per_token=22.2,
    cache_hit_overhead_ms=5.0,
    request_overhead_ms=4.2,
    source="bench engine on this 2-core box (docs/results.md, 'The engine'): SmolLM2-135M Q4_1, 1 thread",
)
"""The engine as measured live, so the cells model what ``bench swarm`` runs."""

SHARED_CORES = 2.0
"""The benchmark box: every node of a local swarm shares its 2 cores."""

GRID: dict[str, tuple[Any, ...]] = {
    "nodes": (4, 16),
    "shared_cores": (SHARED_CORES, 0.0),
    "one_way_ms": (1.0, 50.0, 200.0),
    "concurrency": (4, 16),
}
QUICK_GRID: dict[str, tuple[Any, ...]] = {
    "nodes": (4,),
    "shared_cores": (SHARED_CORES, 0.0),
    "one_way_ms": (1.0, 50.0),
    "concurrency": (4, 16),
}
SUBJECTS = 8
ORACLE_MARGIN = 0.05
"""Target: ``cost`` within 5 % of the oracle (reported, not the guard)."""


def _paired(a: list[float], b: list[float]) -> tuple[float, float]:
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else 0.0
    return mean(diffs), se


def cost_vs_paper(
    out: Path | None = None, *, seeds: int = 5, requests: int = 200, quick: bool = False,
    progress: Progress | None = None, grid: dict[str, tuple[Any, ...]] | None = None, challenger: str = "cost",
) -> dict[str, Any]:
    """Every cell of the grid, ``challenger`` (``cost``) against ``paper`` paired over seeds.

    ``grid`` and ``challenger`` exist for the guard's own test (a policy
    that does lose must fail it)."""
    from .live_bench import mmlu_live_requests
    from .live_experiment import default_cache_budget
    from .live_sim import simulate_live_run

    grid = grid or (QUICK_GRID if quick else GRID)
    policies = (challenger, "paper", "oracle")
    if quick:
        seeds = min(seeds, 3)
        requests = min(requests, 120)
    cells = list(itertools.product(*grid.values()))
    total, done = len(cells) * len(policies) * seeds, 0
    rows: list[dict[str, Any]] = []
    summary: list[dict[str, Any]] = []
    workloads: dict[tuple[int, int], Any] = {}
    for nodes, shared, one_way, conc in cells:
        budget = default_cache_budget(SUBJECTS, nodes)
        per: dict[str, list[float]] = {p: [] for p in policies}
        served: dict[str, list[float]] = {p: [] for p in policies}
        for seed in range(1, seeds + 1):
            key = (nodes, seed)
            if key not in workloads:
                workloads[key] = mmlu_live_requests(requests, nodes, max_subjects=SUBJECTS, seed=seed)[0]
            for policy in policies:
                r = simulate_live_run(
                    workloads[key], policy=policy, nodes=nodes, cache_tokens=budget, one_way_ms=one_way,
                    cost=LIVE_ENGINE, concurrency=conc, seed=seed, shared_cores=shared,
                )
                per[policy].append(r["ttft_ms"]["mean"])
                served[policy].append(r["load"]["served_max_over_mean"] or 0.0)
                rows.append({
                    "nodes": nodes, "shared_cores": shared or None, "one_way_ms": one_way, "concurrency": conc,
                    "seed": seed, "policy": policy, "ttft_ms_mean": r["ttft_ms"]["mean"],
                    "ttft_ms_p99": r["ttft_ms"]["p99"], "hit_rate": r["hit_rate"],
                    "forwarded_share": r["forwarded_share"],
                    "served_max_over_mean": r["load"]["served_max_over_mean"],
                })
                done += 1
                if progress is not None:
                    progress(f"{nodes} nodes, {'shared' if shared else 'apart'}, {one_way:g} ms, {conc} in flight",
                             done, total)
        diff, se = _paired(per[challenger], per["paper"])
        m = {("cost" if p == challenger else p): mean(v) for p, v in per.items()}
        summary.append({
            "nodes": nodes, "machines": f"{shared:g} shared cores" if shared else "own",
            "one_way_ms": one_way, "concurrency": conc, "seeds": seeds, "cache_tokens_per_node": budget,
            **{f"{p}_ttft_ms_mean": round(v, 1) for p, v in m.items()},
            "cost_over_paper": round(m["cost"] / m["paper"], 3),
            "cost_over_oracle": round(m["cost"] / m["oracle"], 3),
            "paired_diff_ms": round(diff, 1), "paired_diff_se_ms": round(se, 1),
            "seeds_cost_worse": sum(c > p for c, p in zip(per[challenger], per["paper"], strict=True)),
            "cost_served_max_over_mean": round(mean(served[challenger]), 3),
            "paper_served_max_over_mean": round(mean(served["paper"]), 3),
            "cost_no_worse_than_paper": diff <= 2 * se,
            "cost_within_5pct_of_oracle": m["cost"] <= (1 + ORACLE_MARGIN) * m["oracle"],
        })
    lost = [s for s in summary if not s["cost_no_worse_than_paper"]]
    far = [s for s in summary if not s["cost_within_5pct_of_oracle"]]
    data: dict[str, Any] = {
        "experiment": "cost-vs-paper",
        "setting": {
            "workload": f"bench swarm's: MMLU five-shot, {SUBJECTS} subjects (shortest headers), 1 output token, "
                        "random entry nodes, closed loop",
            "requests_per_run": requests, "seeds": seeds, "grid": {k: list(v) for k, v in grid.items()},
            "cost_model": LIVE_ENGINE.as_dict(), "quick": quick, "challenger": challenger,
            "guard": "cost mean TTFT - paper's, paired over seeds, at most 2 standard errors in every cell",
        },
        "summary": summary,
        "targets": {
            "cost_never_loses_to_paper": {
                "target": "in every cell, cost mean TTFT at most paper's (paired over seeds, within 2 standard errors)",
                "cells_lost": len(lost), "met": not lost,
            },
            "cost_within_5pct_of_oracle": {
                "target": "in every cell, cost mean TTFT at most 1.05x the oracle's",
                "cells_missed": len(far), "met": not far,
            },
        },
        "runs": rows,
    }
    if out is not None:
        import json

        out.mkdir(parents=True, exist_ok=True)
        path = out / "cost-vs-paper.json"
        path.write_text(json.dumps(data, indent=1) + "\n")
        data["files"] = {"json": str(path)}
    return data
