"""Diagnostic: what crosses the relays of an idle NAT testbed swarm, circuit by circuit.

Sets up the lab nat testbed (2 public relays, cone/cone/symmetric NATs) exactly as
`p2pinfer lab nat` does, lets it settle, waits 20 s, then samples every live circuit's
byte count on both relays over 20 s. Prints one JSON object.
"""
import json, sys, tempfile, time
from pathlib import Path
from p2pinfer.lab.nat_bench import NatSwarm
from p2pinfer.lab.nat_testbed import NatTestbed
from p2pinfer.provenance import with_provenance

nat_cfg = {"reachability_interval_s": 60.0}
log_dir = Path(tempfile.mkdtemp(prefix="relay-idle-"))
out = {}
with NatTestbed(public=2, nats=("cone", "cone", "symmetric"), hosts_per_nat=(1, 1, 2)) as bed:
    swarm = NatSwarm(bed, 1.0, nat_cfg, log_dir)
    try:
        out["settled_s"] = swarm.settle(2, 180)
        time.sleep(20)
        def snap():
            f = swarm.nat()
            return {p: {(c["src"], c["dst"]): c["bytes"] for c in f[p]["relay"]["circuits"]} | {("total", ""): f[p]["relay"]["bytes_relayed"]}
                    for p in ("pub0", "pub1")}
        a = snap(); t0 = time.monotonic(); time.sleep(20); b = snap(); dt = time.monotonic() - t0
        names = swarm.names
        rows = []
        for p in b:
            for k, v in b[p].items():
                rows.append({"relay": p, "src": names.get(k[0], k[0]), "dst": names.get(k[1], k[1]),
                             "bytes_per_s": round((v - a[p].get(k, 0)) / dt, 1), "new_circuit": k not in a[p]})
        out["window_s"] = round(dt, 2)
        out["circuits"] = sorted(rows, key=lambda r: -r["bytes_per_s"])
        out["paths"] = {n: swarm.nat()[n]["paths"] for n in swarm.nodes}
        out["status_counters"] = {n: swarm.nodes[n].call("status")["counters"] for n in swarm.nodes}
    finally:
        swarm.close()
print(json.dumps(with_provenance(out, ["diag relay_idle.py"]), indent=1, default=str))
