"""``p2pinfer lab dashboard-shot``: the dashboard's screenshot for the docs (p2pinfer/lab/dashboard_shot.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer


def register(app: typer.Typer, bench: typer.Typer) -> None:
    """Nothing outside ``p2pinfer lab``."""


def register_lab(lab: typer.Typer) -> None:
    @lab.command("dashboard-shot")
    def dashboard_shot(
        out: Path = typer.Option(Path("docs/dashboard.png"), help="Where to write the PNG (a JSON goes next to it)."),
        nodes: int = typer.Option(4, min=2, max=16, help="Node processes."),
        requests: int = typer.Option(48, min=1, help="MMLU five-shot requests sent while the page is open."),
        subjects: int = typer.Option(4, min=1, max=57, help="MMLU subjects (shortest headers first)."),
        concurrency: int = typer.Option(2, min=1, help="Requests in flight."),
        engine: str = typer.Option("llama-cpp", help="Engine (simulated for a quick look)."),
        cache_tokens: Optional[int] = typer.Option(None, help="Cache budget per node (default: the demo's)."),
        seed: int = typer.Option(1),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ) -> None:
        """A live swarm under the MMLU workload, node 0's dashboard open in headless Chromium, saved as PNG."""
        from ..lab.browser import BrowserUnavailable
        from ..lab.dashboard_shot import take_dashboard_screenshot
        from ..lab.live_experiment import default_cache_budget
        from ..lab.local_swarm import SwarmError
        from ..provenance import provenance

        if cache_tokens is None and engine == "llama-cpp":
            cache_tokens = default_cache_budget(subjects, nodes)
        # Stamped before the run: the PNG and JSON it writes are tracked files, and once
        # written they would make every stamp of a clean checkout "-dirty".
        stamp = provenance()
        try:
            result = take_dashboard_screenshot(out, nodes=nodes, requests=requests, subjects=subjects,
                                               concurrency=concurrency, engine=engine, cache_tokens=cache_tokens,
                                               seed=seed)
        except (BrowserUnavailable, SwarmError, TimeoutError) as exc:
            typer.secho(f"error: {exc}", err=True, fg="red")
            raise typer.Exit(1) from None
        result = {"cache_tokens_per_node": cache_tokens, **result, "provenance": stamp}
        out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
        typer.echo(json.dumps(result) if as_json else f"screenshot written to {out} ({result['completed']} requests "
                   f"completed, hit rate {100 * result['hit_rate']:.1f} %)")
