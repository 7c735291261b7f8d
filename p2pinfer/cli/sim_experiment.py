"""``p2pinfer simulate experiment``: the simulator experiments behind docs/results.md.

The command only; the experiments are in p2pinfer/lab/sim_experiments.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer

from .simulate import _progress_bar, sim_app


def experiment(
    name: str = typer.Argument(..., help="latency, latency-fast, skew, specialisation, hotspot, load, ablations or scale."),
    out: Path = typer.Option(Path("docs/results"), help="Folder for the JSON and PNG outputs."),
    seeds: Optional[int] = typer.Option(None, min=1, help="Seeds per point (default: the experiment's own)."),
    requests: Optional[int] = typer.Option(None, min=100, help="Requests per run (default: the experiment's own)."),
    quick: bool = typer.Option(False, help="Fewer points: a smoke run, not for the docs."),
    as_json: bool = typer.Option(False, "--json", help="Print the experiment's JSON."),
) -> None:
    """Run one experiment of issue 6 and write <out>/<name>.json and <name>.png."""
    from ..lab.sim_experiments import EXPERIMENTS

    if name not in EXPERIMENTS:
        raise typer.BadParameter(f"choose from {', '.join(EXPERIMENTS)}", param_hint="NAME")
    kwargs: dict[str, Any] = {"quick": quick}
    if seeds is not None:
        kwargs["seeds"] = seeds
    if requests is not None:
        kwargs["requests"] = requests
    bar = None
    if not as_json:
        bar, task = _progress_bar(1, f"experiment {name}")
        bar.start()

        def progress(label: str, done: int, total: int) -> None:
            bar.update(task, completed=done, total=total, description=label)

        kwargs["progress"] = progress
    try:
        data = EXPERIMENTS[name](out, **kwargs)
    finally:
        if bar is not None:
            bar.stop()
    if as_json:
        typer.echo(json.dumps(data))
        return
    from rich.console import Console

    console = Console()
    console.print(f"wrote {data['files']['json']} and {data['files']['png']}")
    for key, target in data.get("targets", {}).items():
        console.print(f"target {key}: {'met' if target['met'] else 'MISSED'} - {target['target']}")


def register(app: typer.Typer, bench: typer.Typer) -> None:
    sim_app.command("experiment")(experiment)
