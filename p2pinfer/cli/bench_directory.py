"""``p2pinfer bench directory``: one-topic gossip against the prefix directory, live."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer


def register(app: typer.Typer, bench: typer.Typer) -> None:
    @bench.command("directory")
    def directory(
        nodes: str = typer.Option("8,16,32,64", help="Comma-separated node counts; each runs both discovery modes."),
        requests: int = typer.Option(40, min=1, help="MMLU five-shot requests per run (the same in both modes)."),
        rate: float = typer.Option(1.0, min=0.01, help="Arrivals per second (Poisson), at random nodes."),
        idle: float = typer.Option(15.0, min=1.0, help="Length of the idle window, seconds."),
        settle: float = typer.Option(5.0, min=0.0, help="Seconds to wait after the views are complete."),
        seed: int = typer.Option(0),
        popularity: str = typer.Option("zipf:1", help="Subject popularity: uniform, zipf:S or hot:SHARE."),
        check_cache: bool = typer.Option(
            False, "--check-cache/--no-check-cache",
            help="Nodes keep the prompts they check (the node's default; the simulator follows). Off here by default.",
        ),
        verify: bool = typer.Option(
            True, "--verify/--no-verify",
            help="Nodes check forwarded answers (probation, spot checks), the node's default, and so does the simulator; --no-verify: none.",
        ),
        sim_only: bool = typer.Option(
            False, "--sim-only", help="Only the simulator's predictions for these settings and seed (seconds, no node processes).",
        ),
        out: Optional[Path] = typer.Option(None, help="Also write the JSON to this file (after every run)."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ) -> None:
        """Idle CPU, inbound bytes per node, hit rate and TTFT with gossip and with the directory, next to the simulator's prediction."""
        from ..lab.directory_bench import run_directory_bench

        try:
            counts = [int(x) for x in nodes.split(",") if x.strip()]
        except ValueError:
            raise typer.BadParameter("node counts must be integers, e.g. 8,16,32", param_hint="--nodes") from None
        if not counts or min(counts) < 2:
            raise typer.BadParameter("at least one node count, each at least 2", param_hint="--nodes")

        def write(result: dict) -> None:
            if out is not None:
                out.write_text(json.dumps(result, indent=2) + "\n")

        result = run_directory_bench(
            counts, requests=requests, rate=rate, idle_s=idle, settle_s=settle, seed=seed, popularity=popularity,
            check_cache=check_cache, verify=verify, sim_only=sim_only, progress=None if as_json else lambda msg: typer.echo(msg, err=True), partial=write,
        )
        write(result)
        if as_json:
            typer.echo(json.dumps(result))
            return
        from rich.console import Console
        from rich.table import Table

        table = Table(title="gossip against the prefix directory, live (sim: the simulator's prediction)")
        cols = ("nodes", "discovery", "idle CPU/node", "bytes in/node/s (p99)", "hit rate (sim)", "TTFT ms (sim)")
        for col in cols:
            table.add_column(col, justify="right")
        for r in result["runs"]:
            if sim_only:
                table.add_row(str(r["nodes"]), r["discovery"], "-", f"({r.get('sim_bytes_in_per_node_per_s') or 0:,.0f})",
                              f"({r['sim_hit_rate']:.3f})", f"({r['sim_ttft_ms_mean']:.0f})")
                continue
            if "error" in r:
                table.add_row(str(r["nodes"]), r["discovery"], r["error"][:40], "-", "-", "-")
                continue
            table.add_row(
                str(r["nodes"]), r["discovery"], f"{r['idle_cpu_per_node']:.3f}",
                f"{r.get('bytes_in_per_node_per_s', 0):,.0f} ({r.get('bytes_in_per_node_per_s_p99', 0):,.0f})",
                f"{r['hit_rate']:.3f} ({r['sim_hit_rate']:.3f})", f"{r['ttft_ms_mean']:.0f} ({r['sim_ttft_ms_mean']:.0f})",
            )
        Console().print(table)
