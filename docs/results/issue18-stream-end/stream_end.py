"""Time from a streamed answer's last content chunk to the end of its stream, before and after
issue 18's change (the record sent before the reply is saved), one p2pinfer node each, 1 in flight.

Usage: python stream_end.py BEFORE_SRC AFTER_SRC RUNS REQUESTS MAX_TOKENS > out.json

BEFORE_SRC and AFTER_SRC are detached worktrees of the two commits; each run starts one node from
each (2 threads, --slots 8, reply cache on, the default model), then sends REQUESTS chat requests to
each, alternating (before, after, then after, before, ...), each after the other node is idle again
(its reply saved: it sleeps 2 s, then reads /status), with the official openai client streaming. Adapted from
docs/results/issue18-stream-overhead/stream_end.py (same prompts, same timing of the chunks).
"""
import json
import os
import statistics
import subprocess
import sys
import time

import httpx
import openai

PY = "/work/main/.venv/bin/python"


def start(src: str, port: int, tmp: str) -> subprocess.Popen:
    model = subprocess.run([PY, "-c", "from p2pinfer.engines.model_files import default_model_path as d; print(d())"],
                           env=dict(os.environ, PYTHONPATH=src), capture_output=True, text=True, check=True).stdout.strip()
    cmd = [PY, "-m", "p2pinfer", "node", "--engine", "llama-cpp", "--listen", "/ip4/127.0.0.1/tcp/0",
           "--http-host", "127.0.0.1", "--http-port", str(port), "--key-file", f"{tmp}/node{port}.key", "--quiet",
           "--log-level", "WARNING", "--model", model, "--threads", "2", "--context-size", "4096", "--slots", "8"]
    p = subprocess.Popen(cmd, cwd=src, env=dict(os.environ, PYTHONPATH=src), stdout=open(f"{tmp}/node{port}.log", "wb"),
                         stderr=subprocess.STDOUT, start_new_session=True)
    for _ in range(240):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return p
        except Exception:
            pass
        time.sleep(0.5)
    raise SystemExit(f"node from {src} did not start")


def idle(port: int) -> dict | None:
    """Wait until the node saves no reply; its reply_saves (None when it reports none). It first
    sleeps 2 s and then asks every 0.25 s: one /status request took 23-41 ms of the node's time, and
    asking every 5 ms (tried first: stream-end-fastpoll.json) slowed the save it measures by about half."""
    time.sleep(2.0)
    while True:
        engine = httpx.get(f"http://127.0.0.1:{port}/status", timeout=30).json()["engine"]
        saves = engine.get("reply_saves")
        if saves is None or saves["in_progress"] == 0:
            return saves
        time.sleep(0.25)


def one(port: int, i: int, max_tokens: int) -> dict:
    c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=600)
    msgs = [{"role": "user", "content": f"Question {i}: explain the history of astronomy, part {i}. " * 12}]
    t0 = time.perf_counter()
    st = []
    facts = None
    finish = None
    for ch in c.chat.completions.create(model="default", messages=msgs, max_tokens=max_tokens, temperature=0.0, stream=True):
        if ch.choices and ch.choices[0].delta.content:
            st.append(time.perf_counter())
        if ch.choices and ch.choices[0].finish_reason:
            finish = ch.choices[0].finish_reason
        if ch.model_extra and ch.model_extra.get("p2pinfer"):
            facts = ch.model_extra["p2pinfer"]
    end = time.perf_counter()
    saves = idle(port)
    g = [b - a for a, b in zip(st, st[1:])]
    return {
        "tokens": len(st), "finish_reason": finish, "ttft_ms": round(1000 * (st[0] - t0), 1),
        "median_token_gap_ms": round(1000 * statistics.median(g), 1),
        "last_content_to_end_ms": round(1000 * (end - st[-1]), 1),
        # before: the answer's own facts (the save was done when the stream ended); after: the node's /status
        "reply_save_ms": facts.get("reply_save_ms") if saves is None else saves["last_ms"],
        # after: from the record (the stream's end, engine side) to the end of the save, other slots' steps included
        "reply_save_wall_ms": None if saves is None else saves["last_wall_ms"],
    }


def main() -> None:
    before, after, runs, requests, max_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    tmp = os.environ.get("TMPDIR_NODES", "/tmp/sp18")
    os.makedirs(tmp, exist_ok=True)
    srcs = {"before": before, "after": after}
    commits = {k: subprocess.run(["git", "rev-parse", "HEAD"], cwd=v, capture_output=True, text=True).stdout.strip()
               for k, v in srcs.items()}
    res: dict = {"benchmark": "stream end after the last token, before/after issue 18", "commits": commits,
                 "slots": 8, "threads": 2, "max_tokens": max_tokens, "runs": []}
    for run in range(runs):
        ports = {"before": 18901, "after": 18902}
        nodes = {k: start(srcs[k], ports[k], tmp) for k in ports}
        load_start = os.getloadavg()[0]
        out: dict = {k: [] for k in ports}
        try:
            for i in range(requests):
                order = ["before", "after"] if (i + run) % 2 == 0 else ["after", "before"]
                for k in order:
                    out[k].append(one(ports[k], i, max_tokens))
        finally:
            for p in nodes.values():
                os.killpg(p.pid, 15)
            for p in nodes.values():
                p.wait(timeout=60)
        entry = {"run": run + 1, "load_average_at_start": round(load_start, 2),
                 "load_average_at_end": round(os.getloadavg()[0], 2), "requests": out}
        for k, v in out.items():
            entry[f"{k}_median_last_content_to_end_ms"] = statistics.median(r["last_content_to_end_ms"] for r in v)
            saves = [r["reply_save_ms"] for r in v if r["reply_save_ms"] is not None]
            entry[f"{k}_median_reply_save_ms"] = statistics.median(saves) if saves else None
        res["runs"].append(entry)
    res["command"] = "python " + " ".join(sys.argv)
    res["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
