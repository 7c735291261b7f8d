from __future__ import annotations

from importlib.metadata import entry_points
import json
import os
from pathlib import Path
import re
import subprocess
import sys
import sysconfig

from typer.testing import CliRunner

import p2pinfer
from p2pinfer.cli.main import app

runner = CliRunner()


def test_version_and_help() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and p2pinfer.__version__ in result.output
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0 and "bench" in result.output


def test_console_script_is_installed() -> None:
    # The `p2pinfer` script pip wrote for [project.scripts], run as a user runs it.
    (entry,) = [e for e in entry_points(group="console_scripts") if e.name == "p2pinfer"]
    assert entry.value == "p2pinfer.cli.main:run"
    script = Path(sysconfig.get_path("scripts")) / "p2pinfer"
    assert script.is_file(), f"no console script at {script}"
    out = subprocess.run([str(script), "--version"], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == f"p2pinfer {p2pinfer.__version__}"


def test_bench_route_json_has_the_figures() -> None:
    result = runner.invoke(
        app, ["bench", "route", "--peers", "16", "--blocks-per-peer", "64", "--iterations", "20", "--json"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["peers"] == 16 and data["blocks_per_peer"] == 64
    assert 0 < data["decision_us_p50"] <= data["decision_us_p99"]


def test_bench_route_rejects_unknown_policy() -> None:
    result = runner.invoke(app, ["bench", "route", "--policy", "fastest"])
    assert result.exit_code != 0 and "choose from" in result.output


def test_the_node_banner_names_its_dashboard(tmp_path: Path) -> None:
    # What a volunteer sees after `p2pinfer node`: the dashboard's address, which then serves the page.
    import httpx

    ready = tmp_path / "ready.json"
    cmd = [sys.executable, "-m", "p2pinfer", "node", "--engine", "simulated", "--listen", "/ip4/127.0.0.1/tcp/0",
           "--http-port", "0", "--key-file", "", "--ready-file", str(ready)]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env={**os.environ, "COLUMNS": "250"})
    try:
        lines: list[str] = []
        assert proc.stderr is not None
        for line in proc.stderr:  # the banner comes once the node serves; Ctrl-C is its last line
            lines.append(line)
            if "Ctrl-C to stop" in line:
                break
        banner = "".join(lines)
        match = re.search(r"dashboard (http://127\.0\.0\.1:\d+/dashboard)", banner)
        assert match, banner
        assert match.group(1) == json.loads(ready.read_text())["dashboard"]
        assert httpx.get(match.group(1), timeout=10).status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)
