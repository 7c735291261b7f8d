"""``p2pinfer bench fuzz``: malformed frames, digests, gossip and HTTP bodies.

The command only; what it runs is in p2pinfer/lab/fuzz.py.
"""

from __future__ import annotations

import json

import typer

from ..lab.fuzz import TARGETS, run_fuzz


def register(app: typer.Typer, bench: typer.Typer) -> None:
    @bench.command("fuzz")
    def fuzz(
        targets: str = typer.Option(",".join([*TARGETS, "http"]), help="Comma-separated targets (default: all)."),
        count: int = typer.Option(10_000, min=1, help="Malformed inputs per target."),
        seed: int = typer.Option(1),
        as_json: bool = typer.Option(False, "--json"),
    ) -> None:
        """Mutation-fuzz every decoder a peer or client reaches; exit 1 on any finding."""
        chosen = [t.strip() for t in targets.split(",") if t.strip()]
        known = {*TARGETS, "http"}  # one list: the lab's decoders, and the live node's HTTP API
        if not chosen or set(chosen) - known:
            raise typer.BadParameter(f"choose from {', '.join(sorted(known))}", param_hint="--targets")
        result = run_fuzz(chosen, count, seed)
        from ..provenance import with_provenance

        result = with_provenance(result)
        if as_json:
            typer.echo(json.dumps(result))
        else:
            from rich.console import Console
            from rich.table import Table

            table = Table(title=f"fuzz: {count} malformed inputs per target")
            for col in ("target", "inputs", "accepted", "rejected", "findings", "peak MiB"):
                table.add_column(col)
            for r in result["targets"]:  # type: ignore[attr-defined]
                table.add_row(r["target"], str(r["inputs"]), str(r["accepted"]),
                              str(r["rejected_with_documented_error"]), str(r["findings"]), str(r["peak_memory_mib"]))
            Console().print(table)
        if result["findings"]:
            raise typer.Exit(1)
