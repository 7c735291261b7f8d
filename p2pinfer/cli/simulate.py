"""``p2pinfer simulate``: the discrete-event simulator and its experiments."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer

sim_app = typer.Typer(
    help="Simulate a swarm on a virtual clock with the real routing core (see docs/results.md).",
    invoke_without_command=True,
    no_args_is_help=False,
)

def _progress_bar(total: int, description: str) -> tuple[Any, Any]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), transient=True)
    task = bar.add_task(description, total=total)
    return bar, task


def _print_table(results: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    first = results[0]
    table = Table(
        title=f"{first['nodes']} nodes, {first['requests']} requests, {first['params']['latency']}, "
        f"workload {first['workload'].get('kind')}, tokenizer {first['tokenizer']['name']}"
    )
    for col in ("policy", "TTFT mean ms", "p50", "p99", "hit rate", "forwarded", "gossip B/node/s", "decision us p50", "util"):
        table.add_column(col, justify="right")
    for r in results:
        gossip = r["gossip_bytes_per_node_per_s"]
        table.add_row(
            r["policy"],
            f"{r['ttft_ms']['mean']:.1f}",
            f"{r['ttft_ms']['p50']:.1f}",
            f"{r['ttft_ms']['p99']:.1f}",
            f"{r['hit_rate']:.3f}",
            f"{r['forwarded_share']:.3f}",
            "-" if gossip is None else f"{gossip:,.0f}",
            f"{r['decision_us_p50']:.1f}",
            f"{r['load']['utilisation_mean']:.3f}",
        )
    console = Console()
    console.print(table)
    cm = first["cost_model"]
    console.print(
        f"cost model: prefill {cm['prefill_ms_per_token']} ms/token, decode {cm['decode_ms_per_token']} ms/token "
        f"({cm['source']}); cache {first['params']['cache_tokens_per_node']} tokens/node; "
        f"rate {first['workload'].get('rate_per_s')} req/s"
    )


@sim_app.callback()
def simulate(
    ctx: typer.Context,
    workload: str = typer.Option("mmlu", help="mmlu, conversations or trace."),
    nodes: int = typer.Option(4, min=1, help="Nodes in the swarm."),
    policy: str = typer.Option("cost", help="cost, paper, random, round-robin, least-loaded, local, oracle, or all."),
    latency_ms: str = typer.Option("1", help="One-way delay per hop: MS, uniform:LO:HI or lognormal:MEDIAN:SIGMA."),
    requests: int = typer.Option(3000, min=1, help="Arrivals to simulate (for a trace: at most this many)."),
    rate: Optional[float] = typer.Option(None, min=0.0001, help="Arrivals per second, whole swarm (default 0.35 per node)."),
    popularity: str = typer.Option("uniform", help="MMLU subject popularity: uniform, zipf:S or hot:SHARE."),
    cache_tokens: int = typer.Option(10_000, min=0, help="KV cache budget per node, in tokens."),
    loss: float = typer.Option(0.0, min=0.0, max=0.99, help="Gossip loss probability per message and receiver."),
    busy_valve: bool = typer.Option(True, "--busy-valve/--no-busy-valve", help="Nodes over the busy threshold refuse forwards."),
    busy_queue_ms: float = typer.Option(15000.0, min=0.0, help="Queued prefill (ms) above which a node is busy."),
    work_weight: float = typer.Option(
        1.0, min=0.0, max=10.0, help="TtftEstimator.work_weight for cost and oracle: weight of the prefill work itself under contention (0: greedy TTFT)."
    ),
    drain: bool = typer.Option(
        True, "--drain/--no-drain", help="TtftEstimator.drain_reported_queue (switch off to measure what it brings)."
    ),
    delta_interval: float = typer.Option(0.25, min=0.001, help="Seconds between digest deltas."),
    full_interval: float = typer.Option(5.0, min=0.001, help="Seconds between full digests (only when the digest changed)."),
    load_interval: float = typer.Option(1.0, min=0.001, help="Seconds between load reports while a node has work."),
    keepalive_interval: float = typer.Option(10.0, min=0.001, help="Seconds between an idle node's load reports."),
    peer_ttl: float = typer.Option(30.0, min=0.001, help="Seconds of silence before a peer leaves the view."),
    topic_size: int = typer.Option(
        0, min=0, help="0: one gossip topic; else topics of this many nodes. With --discovery directory: the load-report "
        "neighbourhood (default 8)."
    ),
    discovery: str = typer.Option(
        "gossip",
        help="How nodes learn who caches what. gossip: every cache change is gossiped to the whole topic (bytes per node grow "
        "with the topic); directory: each prefix anchor has a directory node (rendezvous hashing) that holders register "
        "with and entries ask (one round trip), only load reports are gossiped (docs/architecture.md).",
    ),
    load_topics: str = typer.Option(
        "hash", help="--discovery directory: load topics. hash: as the live node, about nodes/topic-size topics (a power "
        "of two), a node's topic the SHA-256 of its id modulo their count (p2pinfer/core/load_topics.py); fill: random "
        "topics filled to exactly --topic-size (the figures published before load topics were live)."
    ),
    anchor_blocks: int = typer.Option(4, min=1, help="--discovery directory: depth of the anchor block (16 tokens each)."),
    directory_replicas: int = typer.Option(1, min=1, max=8, help="--discovery directory: owners per anchor."),
    directory_placement: str = typer.Option(
        "rendezvous", help="--discovery directory: who owns an anchor. kademlia: the peers closest to its key in the KadDHT "
        "keyspace (what the live node runs); rendezvous: highest-random-weight hashing (the published simulator runs)."
    ),
    directory_refresh: str = typer.Option(
        "checksum", help="--discovery directory: checksum (a refresh sends count and XOR per anchor; the directory asks for "
        "what does not match) or full (it re-sends every block)."
    ),
    churn_interval: float = typer.Option(0.0, min=0.0, help="Mean seconds between node replacements (0: none)."),
    shared_cores: float = typer.Option(
        0.0, min=0.0, help="Every node on one machine with this many cores, shared (0: one machine per node)."),
    concurrency: int = typer.Option(
        0, min=0, help="Closed loop: this many requests in flight, the next sent when one completes (0: open loop)."),
    slots: int = typer.Option(
        1, min=1, max=64, help="Requests each node serves at once: continuous batching as in the llama-cpp engine "
        "(prompt chunks interleaved with batched decode steps); 1: one at a time, as the published figures."),
    trace: Optional[Path] = typer.Option(None, help="JSONL trace to replay (with --workload trace)."),
    mmlu_dir: Optional[Path] = typer.Option(None, help="MMLU folder with dev/ and test/ (default: the packaged subset)."),
    tokenizer: str = typer.Option("auto", help="auto (the model's when installed), model or approx."),
    calibration: Optional[list[Path]] = typer.Option(
        None, help="JSON from 'p2pinfer bench engine --json' to calibrate the engine cost model; repeat it for several "
        "runs (the median of each figure). Default: the medians of the three runs under docs/results/issue23-engine-*.json."
    ),
    reply_cache: bool = typer.Option(
        False, "--reply-cache/--no-reply-cache",
        help="A node caches each reply as the next turn renders it (the node setting reply_cache; conversations workload).",
    ),
    verify: bool = typer.Option(
        False, "--verify/--no-verify",
        help="Model the node default's answer checks (probation holds, spot checks on the entry's engine; one slot only). "
        "Off by default, as the published figures.",
    ),
    check_cache: bool = typer.Option(
        True, "--check-cache/--no-check-cache", help="With --verify: a check leaves its prompt in the entry's cache (the node default)."),
    warmup: float = typer.Option(0.1, min=0.0, max=0.9, help="Share of first arrivals left out of the statistics."),
    seed: int = typer.Option(1, help="Seed: the same seed gives the same result."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (a list with --policy all)."),
) -> None:
    """Run one simulation (or every policy on the same requests with --policy all)."""
    if ctx.invoked_subcommand is not None:
        return
    from ..core.router import GossipConfig, RouterConfig
    from ..core.costmodel import EngineCostModel
    from ..core.directory import DirectoryConfig
    from ..sim.runner import WorkloadSpec, build_requests, cost_model_from_bench
    from ..sim.simulator import SIM_POLICIES, SimConfig, Simulator
    from ..workloads import TraceError

    policies = list(SIM_POLICIES) if policy == "all" else [policy]
    for p in policies:
        if p not in SIM_POLICIES:
            raise typer.BadParameter(f"choose from {', '.join(SIM_POLICIES)} or all", param_hint="--policy")
    if workload == "trace" and trace is None:
        raise typer.BadParameter("--workload trace needs --trace FILE", param_hint="--trace")
    spec = WorkloadSpec(
        kind=workload,
        requests=requests,
        rate=rate,
        popularity=popularity,
        mmlu_dir=str(mmlu_dir) if mmlu_dir else None,
        trace=str(trace) if trace else None,
        tokenizer=tokenizer,
    )
    try:
        cost = cost_model_from_bench(*calibration) if calibration else EngineCostModel()
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--calibration") from None
    try:
        directory = DirectoryConfig(
            anchor_blocks=anchor_blocks, replicas=directory_replicas, refresh=directory_refresh, placement=directory_placement
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--directory-refresh") from None
    try:
        gossip = GossipConfig(
            delta_interval_s=delta_interval, full_interval_s=full_interval, load_interval_s=load_interval,
            keepalive_interval_s=keepalive_interval, peer_ttl_s=peer_ttl,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--peer-ttl") from None
    base = SimConfig(
        cost=cost,
        nodes=nodes,
        latency=latency_ms,
        loss=loss,
        cache_tokens=cache_tokens,
        busy_valve=busy_valve,
        busy_queue_ms=busy_queue_ms,
        work_weight=work_weight,
        drain_reported_queue=drain,
        gossip=gossip,
        topic_size=topic_size,
        discovery=discovery,
        load_topics=load_topics,
        directory=directory,
        churn_interval_s=churn_interval,
        shared_cores=shared_cores,
        concurrency=concurrency,
        slots=slots,
        reply_cache=reply_cache,
        verify=RouterConfig().verify if verify else None,
        check_cache=check_cache,
        warmup=warmup,
        seed=seed,
    )
    try:
        base.validate()
        built = build_requests(spec, nodes, seed)
    except (ValueError, TraceError, FileNotFoundError, OSError) as exc:
        raise typer.BadParameter(str(exc)) from None
    results = []
    bar = task = None
    if not as_json:
        bar, task = _progress_bar(len(policies) * len(built[0]), "simulating")
        bar.start()
    try:
        for i, p in enumerate(policies):
            from dataclasses import replace

            def tick(done: int, total: int, _i: int = i, _p: str = p) -> None:
                if bar is not None:
                    bar.update(task, completed=_i * total + done, description=f"simulating {_p}")

            reqs, encoder, info = built
            results.append(Simulator(replace(base, policy=p), reqs, encoder, workload=info, progress=tick).run())
    finally:
        if bar is not None:
            bar.stop()
    if as_json:
        from ..provenance import provenance

        stamp = provenance()  # the command, commit and machine, as every bench JSON; one git call for all policies
        results = [{**r, "provenance": stamp} for r in results]
        typer.echo(json.dumps(results if policy == "all" else results[0]))
    else:
        _print_table(results)


@sim_app.command("export-trace")
def export_trace(
    out: Path = typer.Argument(..., help="JSONL file to write."),
    workload: str = typer.Option("mmlu", help="mmlu or conversations."),
    requests: int = typer.Option(1000, min=1),
    nodes: int = typer.Option(4, min=1, help="Only sets the default rate (0.35 per node)."),
    rate: Optional[float] = typer.Option(None, min=0.0001),
    popularity: str = typer.Option("uniform"),
    tokens: bool = typer.Option(False, "--tokens", help="Write token ids instead of text parts."),
    tokenizer: str = typer.Option("auto"),
    seed: int = typer.Option(1),
) -> None:
    """Write a synthetic workload as a p2pinfer-trace JSONL file (to edit or replay)."""
    from ..sim.runner import WorkloadSpec, build_requests
    from ..workloads import Prompt, TimedRequest, write_trace

    spec = WorkloadSpec(kind=workload, requests=requests, rate=rate, popularity=popularity, tokenizer=tokenizer)
    try:
        reqs, encoder, info = build_requests(spec, nodes, seed)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    if tokens:
        reqs = [
            TimedRequest(r.t, Prompt(r.prompt.label, tokens=tuple(encoder.encode(r.prompt)), output_tokens=r.prompt.output_tokens), r.entry)
            for r in reqs
        ]
    n = write_trace(out, reqs, tokenizer=encoder.tokenizer.name, workload=info)
    typer.echo(f"wrote {n} requests to {out}")


def register(app: typer.Typer, bench: typer.Typer) -> None:
    app.add_typer(sim_app, name="simulate")
