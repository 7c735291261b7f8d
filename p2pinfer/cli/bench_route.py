"""``p2pinfer bench route``: time from a prompt's token ids to a routing decision.

The command only; what it runs is in p2pinfer/lab/route_bench.py.
"""

from __future__ import annotations

import json

import typer

from ..lab.route_bench import run_route_bench


def register(app: typer.Typer, bench: typer.Typer) -> None:
    @bench.command("route")
    def route(
        peers: int = typer.Option(64, min=1, help="Peers in the view."),
        prompt_tokens: int = typer.Option(2048, min=1, help="Prompt length in tokens."),
        blocks_per_peer: int = typer.Option(
            4096, min=0, help="Block hashes in each peer's digest (4096 blocks = 65,536 cached tokens)."
        ),
        holders: int = typer.Option(4, min=0, help="Peers that also cache a prefix of the prompt."),
        policy: str = typer.Option("cost", help="Routing policy to time."),
        iterations: int = typer.Option(2000, min=10, help="Decisions to time."),
        swarm_secret: str = typer.Option("", help="Swarm secret: time keyed (BLAKE3) block hashes."),
        seed: int = typer.Option(1),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ) -> None:
        """Time a routing decision (block hashing included) against a large peer view."""
        from ..core import POLICIES

        if policy not in POLICIES:
            raise typer.BadParameter(f"choose from {', '.join(POLICIES)}", param_hint="--policy")
        result = run_route_bench(
            peers, prompt_tokens, blocks_per_peer, holders, policy, iterations, seed, swarm_secret.encode() or None
        )
        from ..provenance import with_provenance

        result = with_provenance(result)
        if as_json:
            typer.echo(json.dumps(result))
            return
        from rich.console import Console
        from rich.table import Table

        table = Table(title="routing decision time")
        table.add_column("figure")
        table.add_column("value", justify="right")
        for key, value in result.items():
            table.add_row(key, str(value))
        Console().print(table)
