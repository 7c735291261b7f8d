"""Diagnostic: what fills the relayed circuits of an idle NAT testbed swarm, by cause.

Sets up the lab nat testbed (2 public relays, cone/cone/symmetric NATs) as
`p2pinfer lab nat` does, lets it settle, waits 20 s, then for WINDOW seconds
counts on every node what it writes on each connection (p2pinfer/lab/traffic_tap.py:
yamux frames by type and protocol, Noise overhead included; pubsub RPCs by kind)
and on the relays every chunk copied per circuit direction, plus each node's
status counters and keep-alive state. Prints one JSON object.

    flock /work/notes/bench.lock env PYTHONPATH=. python relay_idle_causes.py [lab|default] > out.json

``default``: the nodes run GossipConfig() instead of the lab's LAB_GOSSIP.
"""
import json, sys, tempfile, time
from pathlib import Path
from p2pinfer.lab import nat_bench
from p2pinfer.lab.nat_bench import NatSwarm
from p2pinfer.lab.nat_testbed import NatTestbed
from p2pinfer.provenance import with_provenance

schedule = sys.argv[1] if len(sys.argv) > 1 else "lab"
WINDOW = float(sys.argv[2]) if len(sys.argv) > 2 else 30.0
if schedule == "default":
    nat_bench.LAB_GOSSIP = {}
nat_cfg = {"reachability_interval_s": 60.0}
log_dir = Path(tempfile.mkdtemp(prefix="relay-idle-"))
out = {"schedule": schedule, "gossip": nat_bench.LAB_GOSSIP, "window_s_wanted": WINDOW}


def diff(a, b):
    if isinstance(b, dict):
        return {k: diff(a.get(k, 0) if isinstance(a, dict) else 0, v) for k, v in b.items()}
    if isinstance(b, (int, float)) and not isinstance(b, bool):
        return b - (a if isinstance(a, (int, float)) else 0)
    return b


with NatTestbed(public=2, nats=("cone", "cone", "symmetric"), hosts_per_nat=(1, 1, 2)) as bed:
    swarm = NatSwarm(bed, 1.0, nat_cfg, log_dir)
    try:
        out["settled_s"] = swarm.settle(2, 180)
        time.sleep(20)
        names = swarm.names
        for n in swarm.nodes.values():
            n.call("traffic_tap")
        f0 = swarm.nat()
        c0 = {n: p.call("status")["counters"] for n, p in swarm.nodes.items()}
        t0 = time.monotonic()
        time.sleep(WINDOW)
        f1 = swarm.nat()
        dt = time.monotonic() - t0
        c1 = {n: p.call("status")["counters"] for n, p in swarm.nodes.items()}
        traffic = {n: p.call("traffic") for n, p in swarm.nodes.items()}
        out["window_s"] = round(dt, 2)

        def circuits(f):
            return {(c["src"], c["dst"]): c["bytes"] for p in ("pub0", "pub1") for c in f[p]["relay"]["circuits"]}

        a, b = circuits(f0), circuits(f1)
        out["circuits"] = sorted(
            [{"src": names.get(k[0], k[0]), "dst": names.get(k[1], k[1]), "bytes_per_s": round((v - a.get(k, 0)) / dt, 1),
              "new_circuit": k not in a} for k, v in b.items()], key=lambda r: -r["bytes_per_s"])
        out["relay_chunks_per_s"] = {
            p: {"{}>{}".format(*(names.get(x, x) for x in k.split(">"))):
                {"chunks_per_s": round(v["chunks"] / dt, 2), "bytes_per_s": round(v["bytes"] / dt, 1),
                 "sizes": dict(sorted(v["sizes"].items(), key=lambda kv: -kv[1])[:12])}
                for k, v in traffic[p]["relay_chunks"].items()}
            for p in ("pub0", "pub1")}
        # What each node wrote per peer and path, bytes/s by cause.
        writes = {}
        for n, t in traffic.items():
            for peer, by_path in t["by_peer"].items():
                for path, d in by_path.items():
                    if path == "pubsub_events":
                        writes.setdefault(n, {})[f"{names.get(peer, peer)} pubsub_events"] = d
                        continue
                    writes.setdefault(n, {})[f"{names.get(peer, peer)} {path}"] = {
                        "bytes_per_s": {k: round(v / dt, 1) for k, v in sorted(d["frames"].items(), key=lambda kv: -kv[1])},
                        "frames_per_s": {k: round(v / dt, 2) for k, v in sorted(d["frame_counts"].items(), key=lambda kv: -kv[1])},
                        "pubsub_per_s": {k: round(v / dt, 2) for k, v in sorted(d["pubsub"].items())},
                        "total_bytes_per_s": round(sum(d["frames"].values()) / dt, 1),
                    }
        out["writes"] = writes
        out["keepalive"] = {n: {"wanted": t["keepalive_wanted"], "connections_changed_ago_s": t["connections_changed_ago_s"],
                                "view_not_connected": [names.get(p, p) for p in t["view_not_connected"]],
                                "view": [names.get(p, p) for p in t["view"]]} for n, t in traffic.items()}
        out["counters_in_window"] = {n: diff(c0[n], c1[n]) for n in c1}
        out["paths"] = {n: {names.get(p, p): v for p, v in f1[n]["paths"].items()} for n in f1}
        out["hole_punches"] = {n: len(f1[n]["hole_punches"]) - len(f0[n]["hole_punches"]) for n in f1}
    finally:
        swarm.close()
print(json.dumps(with_provenance(out, ["diag relay_idle_causes.py", schedule, str(WINDOW)]), indent=1, default=str))
