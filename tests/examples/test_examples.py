"""Each example runs for real: processes, libp2p on loopback, the simulated engine."""

from __future__ import annotations

import json
import os
from pathlib import Path
import signal
import subprocess
import sys
import time

import httpx

from p2pinfer.lab.local_swarm import LocalSwarm

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_embedding_example_answers_and_reuses_the_shared_system_prompt() -> None:
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "embed_in_app.py"), "--engine", "simulated", "--max-tokens", "3"],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [line for line in out.stdout.splitlines() if "prompt tokens reused" in line]
    assert len(lines) == 3
    reused = [int(line.split("; ")[1].split("/")[0]) for line in lines]
    assert reused[0] == 0 and reused[1] > 0 and reused[2] > 0  # the system prompt is cached after the first


def test_volunteer_node_joins_a_swarm_and_serves(tmp_path: Path) -> None:
    with LocalSwarm(1, engine="simulated", workdir=tmp_path / "swarm") as swarm:
        seed = swarm.nodes[0]
        ready = tmp_path / "volunteer.json"
        proc = subprocess.Popen(
            [sys.executable, str(EXAMPLES / "volunteer_node.py"), "--engine", "simulated",
             "--listen", "/ip4/127.0.0.1/tcp/0", "--http-port", "0", "--bootstrap", seed.p2p_addr,
             "--key-file", str(tmp_path / "v.key"), "--ready-file", str(ready)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 60
            while not ready.exists():
                assert proc.poll() is None, proc.stdout.read().decode()[-2000:]  # type: ignore[union-attr]
                assert time.monotonic() < deadline, "volunteer did not start"
                time.sleep(0.1)
            info = json.loads(ready.read_text())
            # The swarm's node sees the volunteer as an eligible peer.
            while True:
                peers = httpx.get(seed.http + "/status").json()["peers"]
                if any(p["peer_id"] == info["peer_id"] and p["eligible"] for p in peers):
                    break
                assert time.monotonic() < deadline, f"volunteer never joined: {peers}"
                time.sleep(0.2)
            r = httpx.post(info["http"] + "/v1/completions", json={"prompt": "hello", "max_tokens": 2}, timeout=30)
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
            assert (tmp_path / "v.key").exists()
        finally:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(30)
        assert proc.returncode == 0
