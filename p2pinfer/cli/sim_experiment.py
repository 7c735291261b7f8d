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
    name: str = typer.Argument(
        ..., help="cost-vs-paper, latency, latency-fast, skew, specialisation, hotspot, load, ablations or scale."
    ),
    out: Path = typer.Option(Path("docs/results"), help="Folder for the JSON and PNG outputs."),
    seeds: Optional[int] = typer.Option(None, min=1, help="Seeds per point (default: the experiment's own)."),
    requests: Optional[int] = typer.Option(None, min=100, help="Requests per run (default: the experiment's own)."),
    quick: bool = typer.Option(False, help="Fewer points: a smoke run, not for the docs."),
    as_json: bool = typer.Option(False, "--json", help="Print the experiment's JSON."),
) -> None:
    """Run one experiment of issue 6 and write <out>/<name>.json and <name>.png."""
    from ..provenance import with_provenance
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
        data = with_provenance(EXPERIMENTS[name](out, **kwargs))
        written = Path(data.get("files", {}).get("json", ""))
        if written.is_file():  # the file carries the command and commit too
            written.write_text(json.dumps({k: v for k, v in data.items() if k != "files"}, indent=1) + "\n")
    finally:
        if bar is not None:
            bar.stop()
    guard_failed = name == "cost-vs-paper" and not data["targets"]["cost_never_loses_to_paper"]["met"]
    if as_json:
        typer.echo(json.dumps(data))
    else:
        from rich.console import Console

        console = Console()
        if name == "cost-vs-paper":
            console.print(_guard_table(data))
        console.print("wrote " + " and ".join(data["files"].values()))
        for key, target in data.get("targets", {}).items():
            console.print(f"target {key}: {'met' if target['met'] else 'MISSED'} - {target['target']}")
    if guard_failed:
        typer.secho("cost lost to paper beyond noise in a cell (table above): the regression guard fails",
                    err=True, fg="red")
        raise typer.Exit(1)


def _guard_table(data: dict[str, Any]) -> Any:
    from rich.table import Table

    table = Table(title="cost vs paper (simulator, mean TTFT ms, paired over seeds)")
    for col in ("nodes", "machines", "ms/hop", "in flight", "cost", "paper", "oracle", "cost/paper",
                "cost/oracle", "diff ± se", "verdict"):
        table.add_column(col, justify="right")
    for s in data["summary"]:
        table.add_row(
            str(s["nodes"]), s["machines"], f"{s['one_way_ms']:g}", str(s["concurrency"]),
            f"{s['cost_ttft_ms_mean']:.0f}", f"{s['paper_ttft_ms_mean']:.0f}", f"{s['oracle_ttft_ms_mean']:.0f}",
            f"{s['cost_over_paper']:.3f}", f"{s['cost_over_oracle']:.3f}",
            f"{s['paired_diff_ms']:+.0f} ± {s['paired_diff_se_ms']:.0f}",
            "ok" if s["cost_no_worse_than_paper"] else "[red]LOST[/red]",
        )
    return table


def register(app: typer.Typer, bench: typer.Typer) -> None:
    sim_app.command("experiment")(experiment)
