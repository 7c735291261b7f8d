"""``p2pinfer bench liar``: one lying node in a swarm, with and without the defence.

The command only; what it runs is in p2pinfer/lab/liar_bench.py.
"""

from __future__ import annotations

import json

import typer

from ..lab.liar_bench import SCENARIOS, run_liar
from ..lab.wrong_tokens_bench import WRONG_SCENARIOS


def register(app: typer.Typer, bench: typer.Typer) -> None:
    @bench.command("liar")
    def liar(
        groups: int = typer.Option(12, min=3, help="Prefix groups, spread over the three honest nodes."),
        prefix_tokens: int = typer.Option(480, min=64, help="Shared prefix of each group."),
        suffix_tokens: int = typer.Option(32, min=1, help="Unique tail of each request."),
        requests: int = typer.Option(120, min=10, help="Requests per scenario."),
        rate: float = typer.Option(2.0, min=0.1, help="Requests per second (open loop)."),
        speed: float = typer.Option(1.0, min=0.0, help="Cost model scale: 1 = the calibrated real engine."),
        seed: int = typer.Option(1),
        policy: str = typer.Option("cost", help="Routing policy of every node: cost (the default) or paper (longest claimed match)."),
        scenario: list[str] = typer.Option(
            list(SCENARIOS), help=f"Scenarios to run (repeatable): {', '.join(SCENARIOS)} (a cache liar, simulated "
            f"engines), or {', '.join(WRONG_SCENARIOS)} (a peer returning wrong tokens, real llama.cpp engines)."),
        subjects: int = typer.Option(12, min=4, help="wrong-tokens: MMLU subjects (each cached on one node; from 12 on "
                                     "the liar holds one for each of the three origins to meet it with)."),
        wrong_requests: int = typer.Option(40, min=4, help="wrong-tokens: requests per liar scenario."),
        cost_requests: int = typer.Option(120, min=4, help="wrong-tokens: measured requests of the cost comparison."),
        warmup: int = typer.Option(20, min=0, help="wrong-tokens: random requests after the probation phase, before the cost is measured."),
        max_tokens: int = typer.Option(8, min=1, max=256, help="wrong-tokens: greedy tokens per answer."),
        concurrency: int = typer.Option(4, min=1, help="wrong-tokens: requests in flight in the cost comparison."),
        threads: int = typer.Option(1, min=1, help="wrong-tokens: llama.cpp threads per node."),
        no_cost: bool = typer.Option(False, "--no-cost", help="wrong-tokens: skip the throughput cost comparison."),
        verify_fraction: float = typer.Option(0.1, min=0.0, max=1.0, help="wrong-tokens: verify_fraction of the checked swarm in the cost comparison."),
        verify_delegate: bool = typer.Option(True, "--verify-delegate/--no-verify-delegate",
                                             help="wrong-tokens: whether the checked swarm's spot checks may go to a third peer holding the prefix."),
        as_json: bool = typer.Option(False, "--json"),
    ) -> None:
        """A lying node among honest ones: a cache liar (mispredictions before it is cut off, TTFT after),
        or a peer that returns wrong tokens (answers before every origin distrusts it, false accusations,
        throughput cost of the checks)."""
        unknown = set(scenario) - set(SCENARIOS) - set(WRONG_SCENARIOS)
        if unknown:
            raise typer.BadParameter(f"unknown scenario(s) {sorted(unknown)}; choose from {list(SCENARIOS + WRONG_SCENARIOS)}")
        from ..provenance import with_provenance

        wrong = tuple(s for s in WRONG_SCENARIOS if s in scenario)
        cache = tuple(s for s in SCENARIOS if s in scenario)
        result: dict = {}
        if wrong:
            from ..lab.wrong_tokens_bench import run_wrong_tokens

            result = run_wrong_tokens(
                wrong, subjects=subjects, requests=wrong_requests, cost_requests=cost_requests, warmup=warmup,
                max_tokens=max_tokens, seed=seed, concurrency=concurrency, threads=threads, with_cost=not no_cost,
                verify_fraction=verify_fraction, verify_delegate=verify_delegate,
            )
        if cache:
            cache_result = run_liar(
                groups=groups, prefix_tokens=prefix_tokens, suffix_tokens=suffix_tokens, requests=requests,
                rate_rps=rate, speed=speed, seed=seed, scenarios=cache, policy=policy,
            )
            result = {**cache_result, "wrong_tokens": result} if result else cache_result
        result = with_provenance(result)
        if as_json:
            typer.echo(json.dumps(result))
        else:
            from rich.console import Console
            from rich.pretty import Pretty

            Console().print(Pretty(result))
