"""``p2pinfer bench faults``: kill a serving node with SIGKILL under concurrent streaming requests.

A swarm of ``p2pinfer node`` processes (simulated engine, calibrated cost
model) behind their HTTP APIs. The last node (the victim) caches the
prefixes every request starts with, so origins forward to it. Many
streaming requests are sent at once to the other nodes; once the victim is
serving, it is killed with SIGKILL. Each request must end in exactly one of:

* ``completed``: every token, ``data: [DONE]``, and the text is exactly
  what the engine produces for the prompt when the generation is resumed
  from the tokens already sent (no token repeated, none dropped);
* an explicit failure: an HTTP error or an SSE ``error`` event, with a
  message.

Anything else is counted against the swarm: ``hung`` (no end within the
client timeout), ``lost`` (the connection broke, or the stream ended
without ``[DONE]``), ``corrupt`` (completed, but the text is not the
expected one). Then the victim is restarted with the same key: the time for
it to leave every view, and to rejoin every view with an empty cache, are
reported too. Requests entering *at* the killed node cannot be saved by the
swarm (their TCP connection dies with it); the entry nodes here are the
survivors.
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import time
from typing import Any

from ..core.costmodel import EngineCostModel


_WORDS = (
    "alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega river mountain valley forest ocean "
    "engine kernel packet router digest prefix cache token stream volunteer swarm"
).split()


def group_prefix(g: int, words: int) -> str:
    """A long shared prefix (the victim caches it): a few hundred tokens."""
    rng = random.Random(1000 + g)
    return f"Context {g}: " + " ".join(rng.choice(_WORDS) for _ in range(words)) + "\n"


def expected_text(prompt: str, attempts: list[dict[str, Any]]) -> str:
    """What the simulated engine streams for ``prompt`` when ``attempts`` resumed one another.

    Its next token is a function of the sequence so far
    (:func:`~p2pinfer.engines.simulated.simulated_next_token`), and an attempt
    that resumes runs on the prompt plus the tokens already sent, so the
    answer is the uninterrupted one: as many tokens as the attempts made.
    """
    from ..engines.approx_tokenizer import ApproxTokenizer
    from ..engines.simulated import simulated_next_token

    tok = ApproxTokenizer(49152)
    seq = tok.encode(prompt)
    out: list[int] = []
    for _ in range(sum(int(att["generated_tokens"]) for att in attempts)):
        out.append(simulated_next_token(seq + out))
    return "".join(tok.decode([t]) for t in out)


async def stream_completion(client: Any, url: str, body: dict[str, Any], timeout_s: float,
                            progress: list[int] | None = None) -> dict[str, Any]:
    """POST a streaming completion; classify how it ended (see module docstring).

    ``progress[0]``, when given, is incremented for every text chunk received
    (shared by concurrent requests: how far the swarm's streams have got)."""
    import httpx
    import trio

    rec: dict[str, Any] = {"outcome": "lost", "text": "", "chunks": 0}
    t0 = time.perf_counter()
    with trio.move_on_after(timeout_s) as scope:
        try:
            async with client.stream("POST", url + "/v1/completions", json=body) as resp:
                if resp.status_code != 200:
                    raw = await resp.aread()
                    rec["outcome"] = f"http_{resp.status_code}"
                    rec["error"] = raw.decode(errors="replace")[:300]
                    return rec
                done = False
                async for line in resp.aiter_lines():
                    if line == "data: [DONE]":
                        done = True
                    elif line.startswith("data: "):
                        event = json.loads(line[6:])
                        if "error" in event:
                            rec["outcome"] = "error_event"
                            rec["error"] = str(event["error"].get("message"))[:300]
                            continue
                        choice = event["choices"][0]
                        if choice.get("text"):
                            rec["text"] += choice["text"]
                            rec["chunks"] += 1
                            if progress is not None:
                                progress[0] += 1
                            rec.setdefault("first_chunk_s", time.perf_counter() - t0)
                        if choice.get("finish_reason"):
                            rec["usage"] = event.get("usage")
                            rec["p2pinfer"] = event.get("p2pinfer")
                if rec["outcome"] != "error_event":
                    rec["outcome"] = "finished" if done and "p2pinfer" in rec else "lost"
        except (httpx.HTTPError, OSError) as exc:
            rec["outcome"] = "lost"
            rec["error"] = f"{type(exc).__name__}: {exc}"[:300]
    if scope.cancelled_caught:
        rec["outcome"] = "hung"
    rec["total_s"] = time.perf_counter() - t0
    return rec


def _status(client: Any, node: Any) -> dict[str, Any] | None:
    try:
        return client.get(node.http + "/status", timeout=5.0).json()
    except Exception:
        return None


def _view_of(status: dict[str, Any] | None, peer_id: str) -> dict[str, Any] | None:
    if status is None:
        return None
    return next((p for p in status["peers"] if p["peer_id"] == peer_id), None)


def run_faults(
    *,
    nodes: int = 4,
    requests: int = 50,
    groups: int = 5,
    prefix_words: int = 100,
    max_tokens: int = 48,
    client_timeout_s: float = 90.0,
    restart: bool = True,
    seed: int = 1,
    kill_after_chunks: int = 0,
) -> dict[str, Any]:
    """``kill_after_chunks``: also wait, before the kill, until the clients
    have received this many text chunks in all, so that the kill lands
    mid-stream and the survivors resume answers from the tokens already sent
    (0: kill as soon as the victim serves, usually before its first token)."""
    import httpx
    import trio

    from ..lab.local_swarm import LocalSwarm

    rng = random.Random(seed)
    prefixes = [group_prefix(g, prefix_words) for g in range(groups)]
    with LocalSwarm(nodes, engine="simulated") as swarm, httpx.Client() as http:
        swarm.wait_connected()
        victim, entries = swarm.nodes[-1], swarm.nodes[:-1]
        victim_id = victim.peer_id
        for prefix in prefixes:  # the victim caches every group's prefix
            r = http.post(victim.http + "/v1/completions", json={"prompt": prefix, "max_tokens": 1}, timeout=60)
            r.raise_for_status()
        cached = _status(http, victim)["digest"]["blocks"]  # type: ignore[index]
        deadline = time.monotonic() + 30
        while not all((_view_of(_status(http, n), victim_id) or {}).get("cached_blocks", 0) >= cached for n in entries):
            if time.monotonic() > deadline:
                raise RuntimeError("the entry nodes never learned the victim's cache")
            time.sleep(0.1)

        plan = []
        for i in range(requests):
            g = rng.randrange(groups)
            prompt = prefixes[g] + f"Question {i}: what comes after {rng.choice(_WORDS)}?"
            plan.append((i, entries[i % len(entries)], prompt))
        records: list[dict[str, Any]] = [{} for _ in plan]
        killed: dict[str, float] = {}
        progress = [0]

        async def main() -> None:
            limits = httpx.Limits(max_connections=requests + 10, max_keepalive_connections=requests + 10)
            async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(10.0, read=client_timeout_s)) as client:

                async def one(i: int, node: Any, prompt: str) -> None:
                    body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True}
                    records[i] = await stream_completion(client, node.http, body, client_timeout_s, progress)
                    records[i]["prompt"] = prompt

                async def killer() -> None:
                    # Kill once the victim is really serving forwarded work.
                    t0 = trio.current_time()
                    while trio.current_time() - t0 < 30:
                        try:
                            st = (await client.get(victim.http + "/status", timeout=2.0)).json()
                            if (st["load"]["forwards_in_flight"] >= 2 and trio.current_time() - t0 > 0.3
                                    and progress[0] >= kill_after_chunks):
                                break
                        except httpx.HTTPError:
                            pass
                        await trio.sleep(0.05)
                    os.killpg(victim.process.pid, signal.SIGKILL)
                    killed["at"] = time.monotonic()
                    killed["in_flight_s"] = trio.current_time() - t0
                    killed["chunks"] = progress[0]
                    # Then watch it leave every survivor's view (peer TTL).
                    while time.monotonic() - killed["at"] < 60:
                        gone = 0
                        for node in entries:
                            try:
                                st = (await client.get(node.http + "/status", timeout=5.0)).json()
                            except httpx.HTTPError:
                                continue
                            gone += _view_of(st, victim_id) is None
                        if gone == len(entries):
                            killed["left_s"] = time.monotonic() - killed["at"]
                            return
                        await trio.sleep(0.1)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(killer)
                    for i, node, prompt in plan:
                        nursery.start_soon(one, i, node, prompt)

        t_start = time.monotonic()
        trio.run(main)
        elapsed = time.monotonic() - t_start
        victim.process.wait(10)

        # Rejoining with an empty cache, after a restart with the same key.
        left_s, rejoined_s = killed.get("left_s"), None
        if restart:
            t_restart = time.monotonic()
            # LocalSwarm keeps each node's key file: the same peer id comes back.
            swarm.restart(victim.index)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                views = [_view_of(_status(http, n), victim_id) for n in entries]
                if all(v is not None and v["eligible"] and v["cached_blocks"] == 0 for v in views):
                    rejoined_s = time.monotonic() - t_restart
                    break
                time.sleep(0.1)
        alive = sum(n.alive() for n in swarm.nodes)

    outcomes: dict[str, int] = {}
    corrupt, resumed, retried, victim_served = [], 0, 0, 0
    for rec in records:
        outcome = rec.get("outcome", "lost")
        if outcome == "finished":
            facts = rec["p2pinfer"]
            attempts = facts["attempts"]
            complete = rec.get("usage", {}).get("completion_tokens") == max_tokens
            if complete and rec["text"] == expected_text(rec["prompt"], attempts):
                outcome = "completed"
            else:
                outcome = "corrupt"
                corrupt.append({"attempts": attempts, "usage": rec.get("usage"), "text": rec["text"],
                                "expected": expected_text(rec["prompt"], attempts)})
            retried += len(attempts) > 1
            resumed += any(a["resumed_tokens"] > 0 for a in attempts)
            victim_served += facts["served_by"] == victim_id
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    explicit = sum(v for k, v in outcomes.items() if k.startswith("http_") or k == "error_event")
    totals = [r["total_s"] for r in records if "total_s" in r]
    return {
        "benchmark": "faults",
        "engine": "simulated (calibrated cost model: real queueing, no weights)",
        "cost_model": EngineCostModel().as_dict(),
        "nodes": nodes,
        "entry_nodes": nodes - 1,
        "requests": requests,
        "max_tokens": max_tokens,
        "killed_after_s": round(killed.get("in_flight_s", float("nan")), 2),
        "kill_after_chunks": kill_after_chunks,
        "chunks_before_kill": int(killed.get("chunks", 0)),
        "outcomes": outcomes,
        "completed": outcomes.get("completed", 0),
        "failed_explicitly": explicit,
        "hung": outcomes.get("hung", 0),
        "lost": outcomes.get("lost", 0),
        "corrupt": outcomes.get("corrupt", 0),
        "retried_after_the_kill": retried,
        "resumed_mid_stream": resumed,
        "served_by_victim_before_kill": victim_served,
        "longest_request_s": round(max(totals), 2) if totals else None,
        "median_request_s": round(statistics.median(totals), 2) if totals else None,
        "run_s": round(elapsed, 2),
        "victim_left_every_view_s": None if left_s is None else round(left_s, 2),
        "victim_rejoined_empty_s": None if rejoined_s is None else round(rejoined_s, 2),
        "nodes_alive_at_end": alive,
        "examples": {
            "errors": [r.get("error") for r in records if r.get("error")][:3],
            "corrupt": corrupt[:2],
        },
    }
