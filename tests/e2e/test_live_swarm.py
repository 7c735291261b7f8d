"""Two real llama.cpp node processes on loopback: the paper's claim in miniature."""

from __future__ import annotations

import json
import math
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


def test_demo_command_prints_table_and_writes_plot_and_data(tmp_path: Path) -> None:
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
    # The run's data is saved next to the plot, every request of each policy, stamped with its command.
    data = json.loads((tmp_path / "demo.json").read_text())
    assert [p["policy"] for p in data["policies"]] == ["cost", "random"]
    assert all(p["completed"] == 4 and len(p["outcomes"]) == 4 for p in data["policies"])
    assert data["provenance"]["command"].startswith("p2pinfer demo ") and data["provenance"]["commit"]
    assert str((tmp_path / "demo.json").resolve()) in out.stdout.replace("\n", "")
    # While each swarm ran, the demo said where to watch it.
    assert re.search(r"cost: watch it live at http://127\.0\.0\.1:\d+/dashboard", out.stderr), out.stderr[-2000:]


def test_demo_keep_leaves_the_swarm_and_its_dashboards_up_until_ctrl_c(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "p2pinfer", "demo", "--nodes", "2", "--requests", "4", "--subjects", "1",
         "--policies", "cost", "--out", str(tmp_path / "demo.png"), "--keep"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        # Ctrl-C as a terminal delivers it: a suite started as a background job of a
        # script inherits SIGINT ignored, and Python then keeps it ignored in the demo.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
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


_WORDS = (
    "river stone garden window market silver morning paper engine forest winter letter bridge orange "
    "castle doctor island pocket rabbit ladder circle thunder pencil harbor candle meadow button violin "
    "saddle lantern cotton planet basket mirror feather anchor jacket valley copper tunnel velvet meteor"
).split()


def _words(n: int, seed: int) -> str:
    """``n`` common words, each one token or more (a leading space, no punctuation)."""
    import random

    rng = random.Random(seed)
    return "".join(" " + rng.choice(_WORDS) for _ in range(n))


def _status(url: str) -> dict:
    return httpx.get(url + "/status", timeout=30).json()


def _peer(status: dict, peer_id: str) -> dict | None:
    return next((p for p in status["peers"] if p["peer_id"] == peer_id), None)


def test_cost_forwards_a_long_prefix_from_a_fresh_entry_node_to_its_holder(tmp_path: Path) -> None:
    """``cost`` in two real processes: a request entering at B, which holds
    nothing, goes to A, which holds its long prefix, and A really reuses
    what B predicted.

    B is fresh (it has timed no prefill, so it reports the engine's prior)
    while A has measured its speed: the case issue 23 fixed, where B used to
    compare its prior with A's measurement and recompute cold ("no peer
    beats recompute here"), and where A, at its measured speed, sent the
    prefix's own first request cold to B for B's prior. The prefix is
    sized from quantities measured here, not from this machine's speed: long
    enough that recomputing it at A's measured prefill speed costs
    ``RATIO`` times the round trip B measured to A (plus the policy's 2 ms
    tie floor), so that forwarding must win on a GPU build (fast prefill:
    a longer prefix) and on a loaded box alike.
    """
    RATIO = 4.0
    args = ["--threads", "1"]
    with LocalSwarm(2, engine="llama-cpp", policy="cost", node_args=args, workdir=tmp_path / "swarm") as swarm:
        swarm.wait_connected()
        a, b = swarm.nodes
        # A times a prefill of its own (nothing B's request shares): its measured speed.
        warm = _complete(a.http, _words(160, seed=1))
        assert warm["served_by"] == a.peer_id
        deadline = time.monotonic() + 60
        while True:  # B has A's measured speed and a measured round trip to A
            seen = _peer(_status(b.http), a.peer_id)
            if seen and seen["speed_measured"] and seen["rtt_ms"] is not None:
                break
            assert time.monotonic() < deadline, seen
            time.sleep(0.2)
        ms_per_token, rtt_ms = seen["prefill_ms_per_token"], seen["rtt_ms"]
        assert not _status(b.http)["load"]["speed_measured"]  # B is fresh
        block = 16
        context = int(_status(a.http)["engine"]["context_size"])
        header = max(8 * block, block * math.ceil(RATIO * (rtt_ms + 2.0) / ms_per_token / block))
        # The request is the header plus as much again of its own: at most half of it is held.
        assert 2 * header + 64 <= context, (
            f"prefill at {ms_per_token:.4f} ms/token against a {rtt_ms:.3f} ms round trip needs a "
            f"{header}-token prefix: more than a {context}-token context holds twice"
        )
        shared = _words(header, seed=2)
        held = _complete(a.http, shared + _words(32, seed=3))
        assert held["served_by"] == a.peer_id and held["reused_tokens"] == 0
        a_blocks = _status(a.http)["digest"]["blocks"]
        deadline = time.monotonic() + 60
        while True:  # B's view of A holds A's whole digest, and A's report that it is idle again
            seen = _peer(_status(b.http), a.peer_id)
            if seen and seen["cached_blocks"] >= a_blocks and not seen["queued_prefill_tokens"] and not seen["active_requests"]:
                break
            assert time.monotonic() < deadline, (seen, a_blocks)
            time.sleep(0.2)
        forwarded = _complete(b.http, shared + _words(header, seed=4))
        rtt_ms = _peer(_status(b.http), a.peer_id)["rtt_ms"]
    saving_ms = forwarded["predicted_reused_tokens"] * ms_per_token
    assert saving_ms >= RATIO * rtt_ms, (saving_ms, rtt_ms)  # the premise, measured in this run
    assert forwarded["served_by"] == a.peer_id, forwarded["reason"]
    assert forwarded["hops"] == 1 and not forwarded["served_locally"]
    # Predicted: the header's whole blocks (its tokens are at least its words).
    assert forwarded["predicted_reused_tokens"] >= block * ((header - 1) // block)
    # Realised, by A's engine: at least what B predicted from A's digest.
    assert forwarded["reused_tokens"] >= forwarded["predicted_reused_tokens"]
