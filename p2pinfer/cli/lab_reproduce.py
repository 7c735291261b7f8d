"""``p2pinfer lab reproduce``: the command only; the work is in p2pinfer/lab/reproduce.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer


def register(app: typer.Typer, bench: typer.Typer) -> None:
    pass


def register_lab(lab: typer.Typer) -> None:
    @lab.command("reproduce")
    def reproduce_cmd(
        quick: bool = typer.Option(False, help="Only the quick set (CI: within 10 minutes)."),
        only: Optional[str] = typer.Option(None, help="Comma-separated experiment names (see --list)."),
        max_minutes: float = typer.Option(60.0, help="Without --quick/--only: the experiments that run within this."),
        results: Path = typer.Option(Path("docs/results"), help="The published JSON files."),
        update: bool = typer.Option(False, help="Write the new JSON over a published file whose figures moved."),
        list_: bool = typer.Option(False, "--list", help="List the published experiments and exit."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ) -> None:
        """Re-run published experiments and diff their JSON against docs/results/, field by field."""
        from rich.console import Console
        from rich.table import Table

        from ..lab.reproduce import PUBLISHED, reproduce

        console = Console(stderr=as_json)
        if list_:
            table = Table(title="published experiments")
            for col in ("name", "json", "minutes", "quick", "command"):
                table.add_column(col)
            for e in PUBLISHED:
                table.add_row(e.name, e.json_file, f"{e.minutes:g}", "yes" if e.quick else "", "p2pinfer " + " ".join(e.argv))
            console.print(table)
            return
        names = tuple(n.strip() for n in only.split(",") if n.strip()) if only else ()
        try:
            report = reproduce(results, quick=quick, only=names, max_minutes=max_minutes, update=update,
                               progress=None if as_json else (lambda name: console.print(f"running {name} ...")))
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--only") from None
        if as_json:
            typer.echo(json.dumps(report))
        else:
            for e in report["entries"]:
                colour = {"same": "green", "moved": "yellow", "missing": "red", "error": "red"}[e["status"]]
                console.print(f"[{colour}]{e['name']}: {e['status']}[/{colour}]"
                              + (f" ({e['moved_count']} figures{', updated' if e.get('updated') else ''})"
                                 if e["status"] == "moved" else "")
                              + (f" - {e['error']}" if e["status"] == "error" else "")
                              + (f" [{len(e['added_fields'])} output fields added since, not compared]" if e.get("added_fields") else ""))
                for m in e["moved"][:12]:
                    console.print(f"    {m['path']}: {m['published']!r} -> {m['now']!r}")
                if len(e["moved"]) > 12:
                    console.print(f"    ... {e['moved_count'] - 12} more")
        if not report["ok"]:
            raise typer.Exit(1)
