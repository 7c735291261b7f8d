"""Entry point of the ``p2pinfer`` command.

Each command lives in its own module under :mod:`p2pinfer.cli` and exposes
``register(app, bench)``; heavy imports stay inside the command functions so
that ``p2pinfer --help`` is instant.
"""

from __future__ import annotations

import importlib
from typing import Optional

import typer

from .._version import __version__

app = typer.Typer(
    name="p2pinfer",
    help="Peer-to-peer LLM inference with prefix-cache-aware routing.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
bench = typer.Typer(help="Benchmarks: each prints a table, or one JSON object with --json.", no_args_is_help=True)
app.add_typer(bench, name="bench")
lab = typer.Typer(
    help="The lab: testbeds and reproductions (network namespaces, published figures); each prints JSON with --json.",
    no_args_is_help=True,
)
app.add_typer(lab, name="lab")

COMMAND_MODULES = [
    "p2pinfer.cli.bench_route",
    "p2pinfer.cli.bench_overlay",
    "p2pinfer.cli.bench_engine",
    "p2pinfer.cli.node_cmd",
    "p2pinfer.cli.client_cmds",
    "p2pinfer.cli.swarm_cmd",
    "p2pinfer.cli.demo_cmd",
    "p2pinfer.cli.bench_load",
    "p2pinfer.cli.bench_fuzz",
    "p2pinfer.cli.simulate",
    "p2pinfer.cli.sim_experiment",
    "p2pinfer.cli.bench_liar",
    "p2pinfer.cli.bench_verify",
    "p2pinfer.cli.bench_faults",
    "p2pinfer.cli.doctor_cmd",
    "p2pinfer.cli.bench_repack",
    "p2pinfer.cli.bench_idle",
    "p2pinfer.cli.bench_directory",
    "p2pinfer.cli.lab_reproduce",
    "p2pinfer.cli.lab_dashboard",
    "p2pinfer.cli.bench_api",
    "p2pinfer.cli.bench_concurrency",
    "p2pinfer.cli.lab_nat",
    "p2pinfer.cli.bench_conversations",
]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"p2pinfer {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Optional[bool] = typer.Option(
        None, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Peer-to-peer LLM inference with prefix-cache-aware routing."""


for _name in COMMAND_MODULES:
    _module = importlib.import_module(_name)
    _module.register(app, bench)
    if hasattr(_module, "register_lab"):  # commands under `p2pinfer lab`
        _module.register_lab(lab)


def run() -> None:
    app()


if __name__ == "__main__":
    run()
