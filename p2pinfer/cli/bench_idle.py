"""``p2pinfer bench idle``: background cost of an idle node by swarm size (driver: :mod:`p2pinfer.lab.idle_bench`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer


def _counts(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"--nodes wants comma-separated integers, not {text!r}") from None
    if not counts or any(not 2 <= c <= 256 for c in counts):
        raise typer.BadParameter("--nodes: each count must be in 2..256")
    return counts


def register(app: typer.Typer, bench: typer.Typer) -> None:
    @bench.command("idle")
    def idle(
        nodes: str = typer.Option("2,4,8,16", help="Comma-separated node counts, one idle swarm each."),
        settle: float = typer.Option(10.0, min=0.0, help="Seconds to wait after every view is complete."),
        measure: float = typer.Option(20.0, min=1.0, help="Length of the measured window, seconds."),
        repeats: int = typer.Option(1, min=1, help="Fresh swarms per node count (the median is reported)."),
        profile: Optional[Path] = typer.Option(None, help="Also record node 0 with py-spy (raw stacks into this folder)."),
        profile_seconds: float = typer.Option(20.0, min=1.0, help="Length of the py-spy recording."),
        out: Optional[Path] = typer.Option(None, help="Also write the JSON to this file."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ) -> None:
        """Idle CPU, memory, bytes and messages per node, for swarms of each size (no requests)."""
        from ..lab.idle_bench import run_idle_bench

        counts = _counts(nodes)

        def write(result: dict) -> None:
            if out is not None:
                out.write_text(json.dumps(result, indent=2) + "\n")

        result = run_idle_bench(
            counts, settle_s=settle, measure_s=measure, repeats=repeats, profile_dir=profile,
            profile_s=profile_seconds, progress=None if as_json else lambda msg: typer.echo(msg, err=True),
            partial=write,
        )
        write(result)
        if as_json:
            typer.echo(json.dumps(result))
            return
        from rich.console import Console
        from rich.table import Table

        table = Table(title="an idle node's cost, by swarm size")
        for col in ("nodes", "CPU per node (of a core)", "RSS MiB", "bytes in/s", "bytes out/s", "pubsub RPCs sent/s"):
            table.add_column(col, justify="right")
        for r in result["results"]:
            if "error" in r:
                table.add_row(str(r["nodes"]), "did not start", "-", "-", "-", "-")
                continue
            rpcs = sum(v for k, v in r["messages_per_node_per_s"].items() if k.startswith("pubsub "))
            table.add_row(str(r["nodes"]), f"{r['idle_cpu_per_node']:.4f}", f"{r['rss_mib_per_node']:.0f}",
                          str(r.get("bytes_in_per_node_per_s", "-")), str(r.get("bytes_out_per_node_per_s", "-")), f"{rpcs:.1f}")
        Console().print(table)
        typer.echo(json.dumps(result["machine_holds"], indent=2))
