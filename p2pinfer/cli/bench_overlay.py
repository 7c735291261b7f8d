"""``p2pinfer bench overlay``: what the overlay itself costs, on loopback.

The command only; what it runs is in p2pinfer/lab/overlay_bench.py.
"""

from __future__ import annotations

import json
from typing import Any

import typer

from ..lab.overlay_bench import run_overlay_bench


def register(app: typer.Typer, bench: typer.Typer) -> None:
    @bench.command("overlay")
    def overlay(
        nodes: int = typer.Option(3, min=2, help="Node processes on loopback."),
        forwards: int = typer.Option(200, min=10, help="Local and forwarded requests each (interleaved)."),
        prompt_tokens: int = typer.Option(256, min=16, help="Prompt length in tokens."),
        max_tokens: int = typer.Option(1, min=1, help="Tokens generated per request."),
        samples: int = typer.Option(30, min=3, help="Cache changes timed from one node to the others."),
        rate: float = typer.Option(20.0, min=0.1, help="Requests per second (whole swarm) in the gossip-volume phase."),
        load_seconds: float = typer.Option(10.0, min=1.0, help="Length of the loaded gossip phase."),
        idle_seconds: float = typer.Option(5.0, min=1.0, help="Length of the idle gossip phase."),
        seed: int = typer.Option(1),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ) -> None:
        """Overlay cost on loopback: forwarding latency, digest propagation, gossip volume."""
        result = run_overlay_bench(nodes, forwards, prompt_tokens, max_tokens, samples, rate, load_seconds, idle_seconds, seed)
        from ..provenance import with_provenance

        result = with_provenance(result)
        if as_json:
            typer.echo(json.dumps(result))
            return
        from rich.console import Console
        from rich.table import Table

        table = Table(title="overlay on loopback")
        table.add_column("figure")
        table.add_column("value", justify="right")

        def rows(prefix: str, value: Any) -> None:
            if isinstance(value, dict):
                for k, v in value.items():
                    rows(f"{prefix}.{k}" if prefix else k, v)
            else:
                table.add_row(prefix, str(value))

        rows("", result)
        Console().print(table)
