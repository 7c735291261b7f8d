"""Every benchmark's JSON says where it came from: command, commit, machine (issue 23's rule)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.parametrize("argv", [
    ["bench", "route", "--peers", "4", "--iterations", "10", "--json"],
    ["bench", "fuzz", "--count", "5", "--json"],
    ["bench", "swarm", "--engine", "simulated", "--nodes", "2", "--requests", "4", "--policies", "cost",
     "--no-simulate", "--json"],
])
def test_bench_json_carries_its_provenance(argv: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-m", "p2pinfer", *argv], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    prov = result["provenance"]
    assert prov["command"] == "p2pinfer " + " ".join(argv)
    assert prov["commit"] is None or len(prov["commit"].split("-")[0]) == 40
    assert prov["machine"]["logical_cores"] >= 1


def test_bench_swarm_out_with_a_json_name_keeps_both_the_plot_and_the_json(tmp_path) -> None:
    """``--out run.json`` once wrote the plot there and then the JSON over it."""
    out = tmp_path / "run.json"
    argv = ["bench", "swarm", "--engine", "simulated", "--nodes", "2", "--requests", "4", "--policies", "cost",
            "--no-simulate", "--json", "--out", str(out)]
    proc = subprocess.run([sys.executable, "-m", "p2pinfer", *argv], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    printed = json.loads(proc.stdout.strip().splitlines()[-1])
    saved = json.loads(out.read_text())
    assert saved["policies"] == printed["policies"]
    plot = tmp_path / "run.png"
    assert printed["plot"] == str(plot)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
