"""``p2pinfer demo`` and ``p2pinfer bench swarm``: the paper's experiment on a live local swarm.

The command only; what it runs is in p2pinfer/lab/live_experiment.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer

from ..lab.live_experiment import (
    ALL_LIVE_POLICIES,
    DEMO_POLICIES,
    budget_note,
    default_cache_budget,
    parse_policies,
    plot_policies,
    policy_table,
    replay_result,
    run_or_exit,
)


def register(app: typer.Typer, bench: typer.Typer) -> None:
    @bench.command("swarm-replay")
    def bench_swarm_replay(
        result: Path = typer.Argument(..., exists=True, dir_okay=False, help="JSON written by 'bench swarm --out'."),
        cores: Optional[float] = typer.Option(None, min=0.1, help="Cores the live nodes shared (default: this machine's)."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ) -> None:
        """The simulator's prediction for a saved live run, policy by policy, next to what was measured."""
        from rich.console import Console

        try:
            replayed = replay_result(result, cores)
        except ValueError as exc:
            typer.secho(f"error: {exc}", err=True, fg="red")
            raise typer.Exit(1) from None
        if as_json:
            typer.echo(json.dumps(replayed))
        else:
            Console().print(policy_table(replayed["policies"], f"{result.name}: live and simulated"))

    @app.command("demo")
    def demo(
        nodes: int = typer.Option(4, min=2, max=8, help="Node processes."),
        requests: int = typer.Option(30, min=4, help="MMLU five-shot requests per policy."),
        concurrency: int = typer.Option(2, min=1, help="Requests in flight."),
        subjects: int = typer.Option(6, min=1, max=57, help="MMLU subjects (shortest five-shot headers first)."),
        policies: str = typer.Option(",".join(DEMO_POLICIES), help="Comma-separated policies to compare."),
        out: Path = typer.Option(Path("p2pinfer-demo.png"), help="Where to write the plot; the run's JSON goes next to it (.json)."),
        model: Optional[str] = typer.Option(None, help="GGUF file (default: SmolLM2-135M-Instruct)."),
        seed: int = typer.Option(1),
        keep: bool = typer.Option(
            False, "--keep", help="Keep the last swarm (cost's, when cost is compared) running at the end for its dashboards, until Ctrl-C."),
    ) -> None:
        """A 4-node swarm on the default model answers an MMLU workload under each policy.

        Each swarm's dashboard address is printed while it runs."""
        import time

        from rich.console import Console

        from ..lab.local_swarm import SwarmError

        chosen = parse_policies(policies)
        # The kept swarm is the last one run: cost goes last, so that nothing else runs beside it.
        order = tuple(p for p in chosen if p != "cost") + (("cost",) if "cost" in chosen else ()) if keep else chosen
        console = Console()
        console.print(
            f"[bold]p2pinfer demo[/]: {nodes} llama.cpp nodes on this machine, {requests} MMLU five-shot requests "
            f"per policy ({subjects} subjects, random entry nodes, {concurrency} in flight); every policy starts cold."
        )
        # Like the paper's setting: the subjects fit the swarm's caches together, not one node's.
        budget = default_cache_budget(subjects, nodes)
        console.print(f"cache budget: {budget_note(subjects, nodes, budget)}")
        kept: list[Any] = []
        try:
            result = run_or_exit(
                policies=order, nodes=nodes, requests=requests, concurrency=concurrency, subjects=subjects,
                max_tokens=1, cache_tokens=budget, threads=1, seed=seed, engine="llama-cpp", model=model, quiet=False,
                show_dashboard=True, kept=kept if keep else None,
            )
            result["policies"].sort(key=lambda s: chosen.index(s["policy"]))
            _report(console, result, nodes, out)
            for swarm in kept:
                console.print(f"[bold]the {order[-1]} swarm is still running[/]; its dashboards:")
                for node in swarm.nodes:
                    console.print(f"  node {node.index}  {node.http}/dashboard")
                console.print("Ctrl-C to stop it.")
                try:
                    while True:
                        time.sleep(1.0)
                        swarm.check_alive()
                except KeyboardInterrupt:
                    console.print("stopping the swarm")
                except SwarmError as exc:
                    typer.secho(f"error: {exc}", err=True, fg="red")
                    raise typer.Exit(1) from None
        finally:
            for swarm in kept:
                swarm.__exit__(None, None, None)

    def _report(console: Any, result: dict[str, Any], nodes: int, out: Path) -> None:
        console.print(policy_table(result["policies"], "time to first token per routing policy"))
        plot = plot_policies(result["policies"], out, f"p2pinfer demo: {nodes} nodes, MMLU five-shot")
        by = {s["policy"]: s for s in result["policies"]}
        if "cost" in by and "round-robin" in by and by["cost"]["ttft_ms"]["mean"]:
            ratio = by["round-robin"]["ttft_ms"]["mean"] / by["cost"]["ttft_ms"]["mean"]
            console.print(f"prefix-aware routing (cost) answered {ratio:.1f}x faster on average than round-robin.")
        console.print(f"plot written to [bold]{plot.resolve()}[/]")
        from ..provenance import with_provenance

        data = out.with_suffix(".json")
        data.write_text(json.dumps(with_provenance(result), indent=2))
        console.print(f"the run's data (every request, with the command and commit) written to [bold]{data.resolve()}[/]")

    @bench.command("swarm")
    def bench_swarm(
        nodes: int = typer.Option(4, min=2, max=16, help="Node processes."),
        requests: int = typer.Option(200, min=1, help="MMLU five-shot requests per policy."),
        concurrency: int = typer.Option(4, min=1, help="Requests in flight."),
        subjects: int = typer.Option(8, min=1, max=57, help="MMLU subjects (shortest headers first)."),
        policies: str = typer.Option("all", help="Comma-separated policies, or 'all' (the six live ones)."),
        max_tokens: int = typer.Option(1, min=1, help="Tokens generated per request (MMLU answers are one letter)."),
        cache_tokens: Optional[int] = typer.Option(
            None, help="Cache budget per node; default: the workload's subject prefixes fit the swarm, not one node."),
        threads: int = typer.Option(1, min=1, help="llama.cpp threads per node."),
        slots: int = typer.Option(0, min=0, max=64, help="Requests each llama-cpp node serves at once (0: the engine's default)."),
        delay_ms: Optional[float] = typer.Option(
            None, help="One-way delay per link: each node in its own network namespace with tc netem (needs root)."),
        engine: str = typer.Option("llama-cpp", help="Engine (simulated for a quick dry run)."),
        model: Optional[str] = typer.Option(None, help="GGUF file."),
        seed: int = typer.Option(1),
        simulate: bool = typer.Option(
            True, "--simulate/--no-simulate",
            help="Also replay each policy's arrivals in the simulator (measured delay, the nodes' prefill speed)."),
        out: Optional[Path] = typer.Option(
            None, help="Write the plot (PNG) and the JSON here: FILE.png and FILE.json, whichever suffix FILE has."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ) -> None:
        """Every live policy on the same MMLU workload, each on a fresh (cold) swarm."""
        from rich.console import Console

        chosen = ALL_LIVE_POLICIES if policies == "all" else parse_policies(policies)
        if cache_tokens is None and engine == "llama-cpp":
            cache_tokens = default_cache_budget(subjects, nodes)
        netem = None
        relay_delay = None
        network: dict[str, Any] = {"kind": "loopback"}
        if delay_ms is not None:
            from ..lab.netns import NetemSetup, NetnsUnavailable

            try:
                netem = NetemSetup(nodes, delay_ms)
                netem.__enter__()
                network = netem.describe()
            except NetnsUnavailable as exc:
                netem = None
                relay_delay = delay_ms
                network = {
                    "kind": "loopback through userspace delay relays (p2pinfer.lab.delay_proxy)",
                    "requested_one_way_delay_ms": delay_ms,
                    "netem_unavailable": str(exc),
                }
                typer.secho(f"tc netem in network namespaces is not available here ({exc}); delaying node-to-node "
                            "traffic with userspace relays on loopback instead", err=True, fg="yellow")
        try:
            result = run_or_exit(
                policies=chosen, nodes=nodes, requests=requests, concurrency=concurrency, subjects=subjects,
                max_tokens=max_tokens, cache_tokens=cache_tokens, threads=threads, slots=slots or None, seed=seed, engine=engine,
                model=model, quiet=as_json, netem=netem, link_delay_ms=relay_delay, simulate=simulate,
            )
            rtts = [s["peer_rtt_ms_median"] for s in result["policies"] if s.get("peer_rtt_ms_median") is not None]
            if rtts:
                network["measured_peer_rtt_ms_median"] = sorted(rtts)[len(rtts) // 2]
            result["network"] = network
        finally:
            if netem is not None:
                netem.__exit__(None, None, None)
        if cache_tokens is not None:
            result["cache_budget_note"] = budget_note(subjects, nodes, cache_tokens)
        from ..provenance import with_provenance

        result = with_provenance(result)
        if out is not None:
            # Two files from one name: `--out run.json` once wrote the plot there and then the JSON
            # over it, losing the plot.
            plot = out if out.suffix not in (".json", "") else out.with_suffix(".png")
            plot_policies(result["policies"], plot, f"bench swarm: {nodes} nodes, {requests} requests")
            out.with_suffix(".json").write_text(json.dumps(result, indent=2))
            result["plot"] = str(plot)
        if as_json:
            typer.echo(json.dumps(result))
        else:
            Console().print(policy_table(result["policies"], f"{nodes} nodes, {requests} requests, {concurrency} in flight"))
