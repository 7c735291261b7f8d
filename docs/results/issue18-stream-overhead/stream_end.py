"""Time from a streamed answer's last content chunk to the end of its stream, reply cache on and off (one p2pinfer node each, 1 in flight)."""
import json, os, subprocess, sys, time, statistics, httpx
sys.path.insert(0, "/tmp/sp")
from p2pinfer.provenance import with_provenance
import openai
def start(port, extra):
    env = dict(os.environ, PORT=str(port), EXTRA=extra, SRC="/tmp/sp/after")
    p = subprocess.Popen(["bash", "/tmp/sp/node.sh"], env=env, stdout=open(f"/tmp/sp/drv{port}.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    for _ in range(120):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200: return p
        except Exception: pass
        time.sleep(0.5)
    raise SystemExit("node did not start")
def one(port, i):
    c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
    msgs = [{"role": "user", "content": f"Question {i}: explain the history of astronomy, part {i}. " * 12}]
    t0 = time.perf_counter(); st = []; facts = None
    for ch in c.chat.completions.create(model="default", messages=msgs, max_tokens=64, temperature=0.0, stream=True):
        if ch.choices and ch.choices[0].delta.content: st.append(time.perf_counter())
        if ch.model_extra and ch.model_extra.get("p2pinfer"): facts = ch.model_extra["p2pinfer"]
    end = time.perf_counter(); g = [b - a for a, b in zip(st, st[1:])]
    return {"tokens": len(st), "ttft_ms": round(1000 * (st[0] - t0), 1), "median_token_gap_ms": round(1000 * statistics.median(g), 1),
            "last_content_to_end_ms": round(1000 * (end - st[-1]), 1), "reply_save_ms": facts and facts.get("reply_save_ms")}
nodes = {"reply_cache_on": start(18801, ""), "reply_cache_off": start(18802, "--no-reply-cache")}
ports = {"reply_cache_on": 18801, "reply_cache_off": 18802}
res = {"benchmark": "stream end after the last token", "commit_code": "76d74ea", "slots": 8, "threads": 2, "max_tokens": 64, "requests": {k: [] for k in ports}}
try:
    for i in range(4):
        for k in ports: res["requests"][k].append(one(ports[k], i))
finally:
    for p in nodes.values(): os.killpg(p.pid, 15)
for k, v in res["requests"].items():
    res[k + "_median_last_content_to_end_ms"] = statistics.median(r["last_content_to_end_ms"] for r in v)
print(json.dumps(with_provenance(res)))
