"""``p2pinfer bench fuzz``: malformed frames, digests, gossip and HTTP bodies."""

from __future__ import annotations

import json

import typer


def run_fuzz(targets: list[str], count: int, seed: int) -> dict[str, object]:
    from ..lab.fuzz import TARGETS, fuzz_target

    reports = [fuzz_target(t, count, seed).as_dict() for t in targets if t in TARGETS]
    if "http" in targets:
        import trio

        from ..lab.fuzz import fuzz_http
        from ..lab.local_swarm import LocalSwarm

        with LocalSwarm(1, engine="simulated") as swarm:
            report = trio.run(fuzz_http, swarm.nodes[0].http, count, seed)
            alive = swarm.nodes[0].alive()
        out = report.as_dict()
        out["node_alive_after"] = alive
        if not alive:
            out["findings"] = int(out["findings"]) + 1  # type: ignore[call-overload]
        reports.append(out)
    return {"benchmark": "fuzz", "count_per_target": count, "seed": seed, "targets": reports,
            "findings": sum(int(r["findings"]) for r in reports)}  # type: ignore[call-overload]


def register(app: typer.Typer, bench: typer.Typer) -> None:
    @bench.command("fuzz")
    def fuzz(
        targets: str = typer.Option("digest,request,response,gossip,http", help="Comma-separated targets."),
        count: int = typer.Option(10_000, min=1, help="Malformed inputs per target."),
        seed: int = typer.Option(1),
        as_json: bool = typer.Option(False, "--json"),
    ) -> None:
        """Mutation-fuzz every decoder a peer or client reaches; exit 1 on any finding."""
        chosen = [t.strip() for t in targets.split(",") if t.strip()]
        known = {"digest", "request", "response", "gossip", "http"}
        if not chosen or set(chosen) - known:
            raise typer.BadParameter(f"choose from {', '.join(sorted(known))}", param_hint="--targets")
        result = run_fuzz(chosen, count, seed)
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
