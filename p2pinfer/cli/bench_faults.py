"""``p2pinfer bench faults``: kill a serving node with SIGKILL under concurrent streaming requests.

The command only; what it runs is in p2pinfer/lab/faults_bench.py.
"""

from __future__ import annotations

import json

import typer

from ..lab.faults_bench import run_faults


def register(app: typer.Typer, bench: typer.Typer) -> None:
    @bench.command("faults")
    def faults(
        nodes: int = typer.Option(4, min=3, max=16),
        requests: int = typer.Option(50, min=1, help="Concurrent streaming requests."),
        max_tokens: int = typer.Option(48, min=2),
        restart: bool = typer.Option(True, "--restart/--no-restart", help="Restart the victim and time its rejoin."),
        seed: int = typer.Option(1),
        kill_after_chunks: int = typer.Option(
            0, min=0, help="Also wait until the clients have received this many text chunks in all, so the kill lands mid-stream."),
        as_json: bool = typer.Option(False, "--json"),
    ) -> None:
        """SIGKILL a serving node under concurrent streams: every request completes or fails explicitly."""
        result = run_faults(nodes=nodes, requests=requests, max_tokens=max_tokens, restart=restart, seed=seed,
                            kill_after_chunks=kill_after_chunks)
        from ..provenance import with_provenance

        result = with_provenance(result)
        if as_json:
            typer.echo(json.dumps(result))
        else:
            from rich.console import Console
            from rich.pretty import Pretty

            Console().print(Pretty(result))
        if result["hung"] or result["lost"] or result["corrupt"]:
            raise typer.Exit(1)
