"""The regression guard of issue 22: ``cost`` never loses to the paper's policy.

The simulator runs on a virtual clock with seeded workloads, so these figures
do not depend on this machine's speed.
"""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from p2pinfer.cli.main import app
from p2pinfer.lab.cost_vs_paper import QUICK_GRID, cost_vs_paper


def test_quick_guard_passes_and_names_every_cell(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["simulate", "experiment", "cost-vs-paper", "--quick", "--json", "--out", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    cells = {(s["nodes"], s["machines"], s["one_way_ms"], s["concurrency"]) for s in data["summary"]}
    expected = 1
    for values in QUICK_GRID.values():
        expected *= len(values)
    assert len(cells) == expected
    assert all(s["cost_no_worse_than_paper"] for s in data["summary"]), data["summary"]
    assert data["provenance"]["command"].startswith("p2pinfer ")
    assert json.loads((tmp_path / "cost-vs-paper.json").read_text())["summary"] == data["summary"]


def test_guard_fails_a_policy_that_does_lose() -> None:
    """Round-robin ignores caches: the guard must catch it losing to paper."""
    grid = {"nodes": (4,), "shared_cores": (2.0,), "one_way_ms": (1.0,), "concurrency": (4,)}
    data = cost_vs_paper(None, seeds=4, requests=120, grid=grid, challenger="round-robin")
    (cell,) = data["summary"]
    assert cell["cost_ttft_ms_mean"] > cell["paper_ttft_ms_mean"]
    assert not cell["cost_no_worse_than_paper"]
    assert not data["targets"]["cost_never_loses_to_paper"]["met"]
