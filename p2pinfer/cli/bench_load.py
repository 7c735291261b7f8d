"""``p2pinfer bench load``: many concurrent HTTP clients against a local swarm.

The command only; what it runs is in p2pinfer/lab/load_bench.py.
"""

from __future__ import annotations

import json

import typer

from ..lab.load_bench import run_load


def register(app: typer.Typer, bench: typer.Typer) -> None:
    @bench.command("load")
    def load(
        nodes: int = typer.Option(4, min=1, max=16),
        clients: int = typer.Option(200, min=1, help="Concurrent HTTP clients, each sending one request after another."),
        duration: float = typer.Option(60.0, min=1.0, help="Seconds of load."),
        max_tokens: int = typer.Option(4, min=1),
        max_concurrent: int = typer.Option(32, min=1, help="Each node's HTTP admission limit (then 503)."),
        seed: int = typer.Option(1),
        as_json: bool = typer.Option(False, "--json"),
    ) -> None:
        """A swarm of simulated-engine nodes under many concurrent clients: nothing may be lost."""
        result = run_load(nodes, clients, duration, max_tokens, seed, max_concurrent)
        from ..provenance import with_provenance

        result = with_provenance(result)
        if as_json:
            typer.echo(json.dumps(result))
        else:
            from rich.console import Console
            from rich.pretty import Pretty

            Console().print(Pretty(result))
        if result["lost"]:
            raise typer.Exit(1)
