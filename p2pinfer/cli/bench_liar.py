"""``p2pinfer bench liar``: one lying node in a swarm, with and without the defence.

The command only; what it runs is in p2pinfer/lab/liar_bench.py.
"""

from __future__ import annotations

import json

import typer

from ..lab.liar_bench import SCENARIOS, run_liar


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
        scenario: list[str] = typer.Option(list(SCENARIOS), help="Scenarios to run (repeatable)."),
        as_json: bool = typer.Option(False, "--json"),
    ) -> None:
        """A lying node among honest ones: how many mispredictions before it is cut off, and the TTFT after."""
        unknown = set(scenario) - set(SCENARIOS)
        if unknown:
            raise typer.BadParameter(f"unknown scenario(s) {sorted(unknown)}; choose from {list(SCENARIOS)}")
        result = run_liar(
            groups=groups, prefix_tokens=prefix_tokens, suffix_tokens=suffix_tokens, requests=requests,
            rate_rps=rate, speed=speed, seed=seed, scenarios=tuple(s for s in SCENARIOS if s in scenario), policy=policy,
        )
        if as_json:
            typer.echo(json.dumps(result))
        else:
            from rich.console import Console
            from rich.pretty import Pretty

            Console().print(Pretty(result))
