"""``p2pinfer lab nat``: volunteers behind NAT, relays and hole punching on a namespace testbed."""

from __future__ import annotations

import json
from typing import Optional

import typer


def register(app: typer.Typer, bench: typer.Typer) -> None:
    """Nothing under ``bench``: this command lives in the lab group."""


def register_lab(lab: typer.Typer) -> None:
    @lab.command("nat")
    def lab_nat(
        public: int = typer.Option(2, min=1, max=8, help="Public relay nodes on the WAN (the first is the bootstrap)."),
        nats: str = typer.Option("cone,cone,symmetric", help="NAT routers, comma-separated: cone (port-preserving MASQUERADE) or symmetric (--random-fully)."),
        hosts: str = typer.Option("1,1,2", help="Volunteers behind each NAT, comma-separated (the first cone NAT's first host holds the prefix)."),
        requests: int = typer.Option(60, min=1, max=10000, help="Requests in the main phase."),
        kill_requests: int = typer.Option(30, min=0, max=10000, help="Requests in the relay-kill phase (0: no kill)."),
        rate: float = typer.Option(3.0, min=0.1, max=100.0, help="Requests per second, round-robin over the entry nodes."),
        prefix_tokens: int = typer.Option(1024, min=16, max=8000),
        suffix_tokens: int = typer.Option(32, min=1, max=2000),
        max_tokens: int = typer.Option(8, min=1, max=512),
        speed: float = typer.Option(1.0, min=0.0, help="Cost model scale: 1 = the calibrated real engine."),
        seed: int = typer.Option(0),
        out: Optional[str] = typer.Option(None, "--out", help="Also write the JSON here."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ) -> None:
        """Prefix-aware routing across NATs: relays, hole punching, a relay killed mid-run (needs root)."""
        from ..lab.nat_bench import run_nat_bench
        from ..lab.nat_testbed import NatTestbed, NatTestbedUnavailable
        from ..provenance import with_provenance

        kinds = tuple(k.strip() for k in nats.split(",") if k.strip())
        try:
            counts = tuple(int(h) for h in hosts.split(",") if h.strip())
        except ValueError:
            raise typer.BadParameter("a comma-separated list of counts", param_hint="--hosts") from None
        if len(counts) != len(kinds):
            raise typer.BadParameter(f"{len(kinds)} NATs but {len(counts)} host counts", param_hint="--hosts")
        if "cone" not in kinds:
            raise typer.BadParameter("at least one cone NAT (the holder sits behind it)", param_hint="--nats")
        try:
            NatTestbed(public=public, nats=kinds, hosts_per_nat=counts)  # type: ignore[arg-type]  # validates
            NatTestbed.check_available()
        except (ValueError, NatTestbedUnavailable) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        result = with_provenance(run_nat_bench(
            public=public, nats=kinds, hosts_per_nat=counts, requests=requests, kill_requests=kill_requests,
            rate_rps=rate, prefix_tokens=prefix_tokens, suffix_tokens=suffix_tokens, max_tokens=max_tokens,
            speed=speed, seed=seed,
        ))
        text = json.dumps(result)
        if out:
            with open(out, "w") as fh:
                fh.write(text + "\n")
        if as_json:
            typer.echo(text)
            return
        from rich.console import Console
        from rich.table import Table

        console = Console()
        console.print(f"served by the holder: {result['served_by_holder']}/{result['requests']}, failed {result['failed']}")
        table = Table(title="forward overhead by path (ms)")
        for col in ("path", "requests", "p50", "p90", "added p50", "added p90"):
            table.add_column(col, justify="right")
        for path, n in result["request_paths"].items():
            table.add_row(path, str(n), str(result["overhead_ms_p50"].get(path)), str(result["overhead_ms_p90"].get(path)),
                          str(result["added_ms_p50"].get(path, "")), str(result["added_ms_p90"].get(path, "")))
        console.print(table)
        console.print({"hole_punch": result["hole_punch"]["by_nat_kinds"], "relay_bytes": result["relay_bytes"],
                       "reachable_after_start_s": result["reachable_after_start_s"], "relay_kill": result["relay_kill"]})
