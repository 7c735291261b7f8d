"""Two real llama.cpp node processes on loopback: the paper's claim in miniature."""

from __future__ import annotations

import json
from pathlib import Path
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest

from p2pinfer.lab.live_bench import mmlu_live_requests
from p2pinfer.lab.local_swarm import LocalSwarm

pytestmark = pytest.mark.model


def _complete(url: str, prompt: str, max_tokens: int = 1) -> dict:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    r = httpx.post(url + "/v1/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    data = r.json()
    return {**data["p2pinfer"], "text": data["choices"][0]["text"]}


@pytest.mark.parametrize("policy", ["paper"])
def test_request_goes_to_the_node_that_caches_its_prefix_and_answers_as_a_cold_run(tmp_path: Path, policy: str) -> None:
    """Routed to the holder, the header really reused there, and the same greedy tokens as a cold run.

    ``paper`` follows the longest estimated match, whatever the speed
    estimates say.
    """
    reqs, _ = mmlu_live_requests(4, 2, max_subjects=1, seed=3)
    first, second = reqs[0].prompt, next(r.prompt for r in reqs[1:] if r.prompt != reqs[0].prompt)
    args = ["--threads", "1"]
    with LocalSwarm(2, engine="llama-cpp", policy=policy, node_args=args, workdir=tmp_path / "swarm") as swarm:
        swarm.wait_connected()
        a, b = swarm.nodes
        facts = _complete(a.http, first)
        assert facts["served_by"] == a.peer_id and facts["reused_tokens"] == 0
        # Wait until B's view of A holds the five-shot header.
        deadline = time.monotonic() + 30
        while True:
            peers = httpx.get(b.http + "/status").json()["peers"]
            if any(p["peer_id"] == a.peer_id and p["cached_blocks"] >= 8 for p in peers):
                break
            assert time.monotonic() < deadline, peers
            time.sleep(0.1)
        forwarded = _complete(b.http, second, max_tokens=16)
        assert forwarded["served_by"] == a.peer_id, forwarded["reason"]
        assert forwarded["hops"] == 1
        assert forwarded["predicted_reused_tokens"] >= 128
        # The engine's own count: the shared header really came from A's cache.
        assert forwarded["reused_tokens"] >= forwarded["predicted_reused_tokens"] - 16
    # A cold run of the same prompt, in a fresh process with the same settings.
    with LocalSwarm(1, engine="llama-cpp", policy=policy, node_args=args, workdir=tmp_path / "cold") as cold_swarm:
        cold = _complete(cold_swarm.nodes[0].http, second, max_tokens=16)
    assert cold["reused_tokens"] == 0 and cold["hops"] == 0
    assert forwarded["text"] == cold["text"] and len(cold["text"]) > 0


def test_bench_swarm_small_run_reports_every_figure(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "p2pinfer", "bench", "swarm", "--nodes", "2", "--requests", "6", "--subjects", "1",
         "--concurrency", "1", "--policies", "cost,round-robin", "--out", str(tmp_path / "swarm.png"), "--json"],
        capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert [p["policy"] for p in result["policies"]] == ["cost", "round-robin"]
    for p in result["policies"]:
        assert p["completed"] == 6 and p["failed"] == 0
        assert p["ttft_ms"]["mean"] > 0 and 0 <= p["hit_rate"] <= 1
        # The simulator's prediction for the same arrivals, delay and node speed.
        sim = p["simulator"]
        assert sim["ttft_ms"]["mean"] > 0 and sim["one_way_ms"] > 0
        assert sim["cost_model"]["prefill_ms_per_token"] > 0 and "live" in sim["cost_model"]["source"]
        assert sim["shared_cores"] >= 1 and sim["one_machine_per_node"]["ttft_ms"]["mean"] > 0
    cost = result["policies"][0]
    assert cost["hit_rate"] > 0  # five questions of one subject share its header
    assert (tmp_path / "swarm.png").stat().st_size > 1000
    assert result["cache_budget_note"]


def test_demo_command_prints_table_and_writes_plot(tmp_path: Path) -> None:
    plot = tmp_path / "demo.png"
    out = subprocess.run(
        [sys.executable, "-m", "p2pinfer", "demo", "--nodes", "2", "--requests", "4", "--subjects", "1",
         "--policies", "cost,random", "--out", str(plot)],
        capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "time to first token per routing policy" in out.stdout
    assert "cost" in out.stdout and "random" in out.stdout
    assert str(plot.resolve()) in out.stdout.replace("\n", "")
    assert plot.stat().st_size > 1000
    # While each swarm ran, the demo said where to watch it.
    assert re.search(r"cost: watch it live at http://127\.0\.0\.1:\d+/dashboard", out.stderr), out.stderr[-2000:]


def test_demo_keep_leaves_the_swarm_and_its_dashboards_up_until_ctrl_c(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "p2pinfer", "demo", "--nodes", "2", "--requests", "4", "--subjects", "1",
         "--policies", "cost", "--out", str(tmp_path / "demo.png"), "--keep"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        lines: list[str] = []
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "Ctrl-C to stop it" in line:
                break
        text = "".join(lines)
        urls = re.findall(r"node \d+\s+(http://127\.0\.0\.1:\d+)/dashboard", text)
        assert len(urls) == 2, text[-3000:]
        for url in urls:
            assert httpx.get(url + "/dashboard", timeout=10).status_code == 200
            assert len(httpx.get(url + "/status", timeout=10).json()["peers"]) == 1
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
        for url in urls:
            with pytest.raises(httpx.HTTPError):
                httpx.get(url + "/health", timeout=2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
