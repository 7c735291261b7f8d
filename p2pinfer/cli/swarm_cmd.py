"""``p2pinfer swarm``: a local swarm on loopback to try things."""

from __future__ import annotations

import time
from typing import Optional

import typer


def register(app: typer.Typer, bench: typer.Typer) -> None:
    @app.command("swarm")
    def swarm(
        nodes: int = typer.Option(3, "--nodes", "-n", min=1, max=32, help="Node processes to start."),
        engine: str = typer.Option("llama-cpp", help="Engine for every node."),
        model: Optional[str] = typer.Option(None, help="GGUF file (default: SmolLM2-135M-Instruct)."),
        policy: str = typer.Option("cost", help="Routing policy of every node."),
        cache_tokens: Optional[int] = typer.Option(None, help="Prefix-cache budget per node, in tokens."),
        threads: int = typer.Option(1, help="llama.cpp threads per node."),
    ) -> None:
        """Start N nodes on 127.0.0.1 that find each other; Ctrl-C stops them all."""
        from rich.console import Console
        from rich.table import Table

        from ..lab.local_swarm import LocalSwarm, SwarmError

        args: list[str] = []
        if model:
            args += ["--model", model]
        if cache_tokens is not None:
            args += ["--cache-tokens", str(cache_tokens)]
        if engine == "llama-cpp":
            args += ["--threads", str(threads)]
        console = Console()
        try:
            with console.status(f"starting {nodes} nodes…"), LocalSwarm(nodes, engine=engine, policy=policy, node_args=args) as local:
                local.wait_connected()
                table = Table(title=f"local swarm: {nodes} nodes, policy {policy}")
                for col in ("#", "HTTP API", "peer id", "log"):
                    table.add_column(col)
                for node in local.nodes:
                    table.add_row(str(node.index), node.http, node.peer_id[:24] + "…", str(node.log_path))
                console.print(table)
                console.print(f"Try: p2pinfer ask --url {local.nodes[0].http} 'What is a radix tree?'")
                console.print("Ctrl-C stops the swarm.")
                try:
                    while all(n.alive() for n in local.nodes):
                        time.sleep(0.5)
                    for dead in (n for n in local.nodes if not n.alive()):
                        console.print(dead.death_report(), style="red", markup=False)
                    console.print("stopping the swarm")
                    raise typer.Exit(1)
                except KeyboardInterrupt:
                    console.print("stopping…")
        except SwarmError as exc:
            typer.secho(f"error: {exc}", err=True, fg="red")
            raise typer.Exit(1) from None
