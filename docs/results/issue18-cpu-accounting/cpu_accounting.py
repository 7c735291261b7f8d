"""Where the CPU goes, p2pinfer node against llama-server (issue 18), alternating pairs.

One server at a time on the same machine: a `p2pinfer node` (2 threads, --slots 8, no reply cache,
so that every answer's work is inside the timed window) or llama-server (-np 8, --no-repack), N
client threads each sending 4 streaming chat requests (64 greedy tokens, ~300-token MMLU prompts, no
two alike; a pair's two runs get the same prompts) with the official `openai` client; tokens are the
answers' `usage.completion_tokens`. Per thread of the server process: CPU seconds from
/proc/PID/task/*/stat; the machine's idle seconds from /proc/stat; the client's own CPU.

argv: LLAMA_SERVER_BINARY LEVELS(comma) PAIRS OUT.json [KIND_A,KIND_B]; kinds: p2pinfer (default
settings), p2pinfer-fa-on (--flash-attn on), llama-server (its defaults, -fa auto), llama-server-fa-off
(-fa off); the pair defaults to p2pinfer,llama-server.
"""
import json, os, subprocess, sys, threading, time

import openai, trio
from p2pinfer.engines.llama_cpp import LlamaCppEngine
from p2pinfer.engines.model_files import default_model_path
from p2pinfer.lab.concurrency_bench import LlamaServer, P2pinferNode, build_prompts

binary, levels, pairs, out = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], int(sys.argv[3]), sys.argv[4]
kinds = tuple(sys.argv[5].split(",")) if len(sys.argv) > 5 else ("p2pinfer", "llama-server")
assert len(kinds) == 2 and set(kinds) <= {"p2pinfer", "p2pinfer-fa-on", "llama-server", "llama-server-fa-off"}, kinds
PER_CLIENT = 4
HZ = os.sysconf("SC_CLK_TCK")
path = str(default_model_path())
eng = LlamaCppEngine(path, context_size=1024, threads=1, slots=1)
need = sum(pairs * (PER_CLIENT * n + 1) for n in levels)
prompts = build_prompts(eng, need)
trio.run(eng.aclose)
del eng
cursor = 0


def thread_cpu(pid: int) -> dict[str, float]:
    got = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = open(f"/proc/{pid}/task/{tid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        got[tid] = (int(fields[11]) + int(fields[12])) / HZ
    return got


def idle_s() -> float:
    return int(open("/proc/stat").readline().split()[4]) / HZ


def measure(kind: str, n: int, batch: list) -> dict:
    """One server, fresh, under ``n`` clients sending ``batch`` (its first prompt is the untimed warm-up)."""
    if kind.startswith("p2pinfer"):
        server = P2pinferNode(path, threads=2, context_size=4096, slots=8, reply_cache=False,
                              flash_attn="on" if kind.endswith("fa-on") else "auto")
        pid = server._swarm.nodes[0].process.pid
    else:
        server = LlamaServer(binary, path, threads=2, context_size=4096, slots=8,
                             extra_args=("-fa", "off") if kind.endswith("fa-off") else ())
        pid = server._proc.pid
    counts: list[int] = []

    def one(prompt) -> int:
        client = openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0, timeout=600)
        k = 0
        for ch in client.chat.completions.create(model="default", messages=list(prompt.messages), max_tokens=64,
                                                 temperature=0.0, stream=True, stream_options={"include_usage": True}):
            if ch.usage is not None:
                k = ch.usage.completion_tokens
        return k

    def client(i: int) -> None:
        for j in range(PER_CLIENT):
            counts.append(one(batch[1 + i * PER_CLIENT + j]))

    try:
        one(batch[0])  # warm-up, untimed
        c0, i0, p0, t0 = thread_cpu(pid), idle_s(), time.process_time(), time.perf_counter()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        c1, i1, p1 = thread_cpu(pid), idle_s(), time.process_time()
    finally:
        server.stop()
    per = sorted(((c1[t] - c0.get(t, 0.0)) for t in c1), reverse=True)
    main = c1[str(pid)] - c0.get(str(pid), 0.0)
    tokens = sum(counts)
    return {
        "server": kind, "concurrency": n, "requests": len(counts), "completion_tokens": tokens,
        "wall_s": round(wall, 2), "tokens_per_s": round(tokens / wall, 2),
        "server_cpu_s": round(sum(per), 2), "two_busiest_threads_cpu_s": [round(x, 2) for x in per[:2]],
        "other_threads_cpu_s": round(sum(per[2:]), 2), "main_thread_cpu_s": round(main, 2),
        "client_cpu_s": round(p1 - p0, 2), "machine_idle_s": round(i1 - i0, 2),
        "server_cpu_ms_per_token": round(1000 * sum(per) / tokens, 2),
    }


runs = []
for n in levels:
    for p in range(pairs):
        batch = prompts[cursor:cursor + PER_CLIENT * n + 1]  # the same prompts for both servers of a pair
        cursor += PER_CLIENT * n + 1
        for kind in (kinds if p % 2 == 0 else kinds[::-1]):
            runs.append(measure(kind, n, batch))
            print(json.dumps(runs[-1]), flush=True)
commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
json.dump({"command": "python docs/results/issue18-cpu-accounting/cpu_accounting.py " + " ".join(sys.argv[1:]),
           "commit": commit, "load_average_at_end": os.getloadavg(), "runs": runs}, open(out, "w"), indent=1)
