"""``p2pinfer bench idle``: what an idle node costs its machine, by swarm size.

For each node count N: N node processes (``p2pinfer.lab.scripted_node``, the
simulated engine, the default :class:`~p2pinfer.net.config.NodeConfig` a
user gets from ``p2pinfer node --engine simulated``) on TCP loopback, the
first one the bootstrap of the others, no requests at all. Once every node
has every other in its view, and after a settle time, one window of
``measure_s`` seconds is measured:

* CPU per node, from ``/proc/<pid>/stat`` (utime + stime of all its
  threads), as a fraction of one core: robust to a loaded machine, since a
  process that waits for a core is not charged for the wait;
* resident memory per node (``VmRSS``);
* TCP payload bytes in and out per node per second from the kernel's
  ``tcp_info`` (``ss``, polled by :class:`~p2pinfer.lab.tcp_meter.TcpByteMeter`
  so that connections closed in the window still count): everything libp2p sends, gossipsub control
  traffic, Noise and yamux framing, pings and pulls included;
* messages per second by kind: pubsub RPCs written (our messages, relayed
  copies, IHAVE/IWANT/GRAFT/PRUNE/IDONTWANT, subscriptions), RTT probes,
  digest pulls, from the nodes' own counters.

The nodes are not called during the window (the driver reads their
counters before and after it), so the figures are the node's own
background cost. ``profile_s`` adds a py-spy recording (100 Hz) of one
node after the window (py-spy pauses the process to sample it, which
costs the machine, not the node).
"""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
import os
from pathlib import Path
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any, Mapping

from ..provenance import provenance
from .tcp_meter import TcpByteMeter

__all__ = [
    "IdleSwarm",
    "cpu_seconds",
    "rss_mib",
    "run_idle_bench",
    "summarize_pyspy_raw",
]

_CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- reading the kernel's figures ----------------------------------------------------------
def cpu_times(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of every thread of ``pid`` so far (``/proc/<pid>/stat``)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "
    return int(fields[11]) / _CLK_TCK, int(fields[12]) / _CLK_TCK  # utime, stime (fields 14, 15)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of every thread of ``pid`` so far."""
    return sum(cpu_times(pid))


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def mem_available_mib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return 0.0


# -- py-spy ------------------------------------------------------------------------------------
_WAITS = ("EpollIOManager.get_events (trio/", "Condition.wait (threading.py)", "Event.wait (threading.py)")
"""Innermost frames that are a thread waiting (py-spy's idle detection lets some through)."""


def summarize_pyspy_raw(path: Path, top: int = 25) -> dict[str, Any]:
    """Inclusive and self shares of functions in a py-spy ``--format raw`` file.

    Samples whose innermost frame is a wait (:data:`_WAITS`: trio's epoll
    wait, a thread's condition wait) are counted apart and left out of the
    shares, which are then shares of the node's busy time.
    """
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    waiting = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        if frames[-1].startswith(_WAITS):
            waiting += count
            continue
        total += count
        for frame in set(frames):
            inclusive[frame] += count
        own[frames[-1]] += count
    if not total:
        return {"samples": 0, "waiting_samples": waiting}

    def share(c: Counter[str]) -> list[tuple[str, float]]:
        return [(name, round(100 * n / total, 1)) for name, n in c.most_common(top)]

    return {"samples": total, "waiting_samples": waiting, "inclusive_percent": share(inclusive), "self_percent": share(own)}


def _pyspy() -> str | None:
    here = Path(sys.executable).with_name("py-spy")
    return str(here) if here.exists() else shutil.which("py-spy")


# -- the swarm -----------------------------------------------------------------------------------
def idle_node_config(
    bootstrap: tuple[str, ...], *, discovery: str = "gossip", engine_options: Mapping[str, Any] | None = None,
    verify: Any = None,
) -> Any:
    """The defaults of ``p2pinfer node --engine simulated``, on an ephemeral loopback port;
    ``verify``: a :class:`~p2pinfer.core.verify.VerifyConfig` in place of the default."""
    from dataclasses import replace

    from ..net.config import NodeConfig

    config = NodeConfig(listen=("/ip4/127.0.0.1/tcp/0",), bootstrap=bootstrap, engine="simulated", discovery=discovery,
                        engine_options=dict(engine_options or {}))
    if verify is not None:
        config = config.replace(router=replace(config.router, verify=verify))
    return config


class IdleSwarm:
    """N idle node processes on loopback, bootstrapped from the first."""

    def __init__(
        self, n: int, *, log_dir: Path | None = None, start_parallel: int = 4, start_timeout_s: float = 120.0,
        discovery: str = "gossip", engine_options: Mapping[str, Any] | None = None, verify: Any = None,
    ) -> None:
        """``discovery``, ``engine_options`` and ``verify``: those of every node (``bench directory``)."""
        from .node_process import NodeProcess

        def config(bootstrap: tuple[str, ...]) -> Any:
            return idle_node_config(bootstrap, discovery=discovery, engine_options=engine_options, verify=verify)

        self.procs: list[Any] = []
        try:
            first = NodeProcess(config(()), "idle-0", log_dir=log_dir, start_timeout_s=start_timeout_s)
            self.procs.append(first)
            with ThreadPoolExecutor(max(1, start_parallel)) as pool:
                futures = [
                    pool.submit(NodeProcess, config((first.addr,)), f"idle-{i}", log_dir, start_timeout_s) for i in range(1, n)
                ]
                errors = []
                for fut in futures:
                    try:
                        self.procs.append(fut.result())
                    except Exception as exc:  # did not start: reported by the caller
                        errors.append(str(exc)[:300])
                if errors:
                    raise RuntimeError(f"{len(errors)} of {n} nodes did not start: {errors[0]}")
        except BaseException:
            self.close()
            raise

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def views_complete(self) -> bool:
        if self.exited():
            return False
        ids = {p.peer_id for p in self.procs}
        for p in self.procs:
            try:
                view = p.call("view", timeout_s=60)
            except Exception:
                return False
            if any(not view.get(other, {}).get("eligible") for other in ids - {p.peer_id}):
                return False
        return True

    def eligible_share(self) -> float | None:
        """Share of (node, other node) pairs in which the node holds the other as eligible."""
        ids = {p.peer_id for p in self.procs}
        held = pairs = 0
        for p in self.procs:
            try:
                view = p.call("view", timeout_s=60)
            except Exception:
                return None
            for other in ids - {p.peer_id}:
                pairs += 1
                held += bool(view.get(other, {}).get("eligible"))
        return round(held / pairs, 4) if pairs else None

    def wait_complete(self, timeout_s: float, poll_s: float = 1.0) -> float | None:
        """Seconds until every node has every other in its view; None if not within ``timeout_s``."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if self.views_complete():
                return time.monotonic() - t0
            time.sleep(poll_s)
        return None

    def exited(self) -> list[str]:
        """Names of node processes that are no longer running (a crash is a result too)."""
        return [p.name for p in self.procs if p.proc.poll() is not None]

    def alive(self) -> list[Any]:
        return [p for p in self.procs if p.proc.poll() is None]

    def statuses(self, procs: list[Any]) -> list[dict[str, Any] | None]:
        out: list[dict[str, Any] | None] = []
        for p in procs:
            try:
                out.append(p.call("status", timeout_s=60))
            except Exception:  # exited meanwhile, or too busy to answer
                out.append(None)
        return out

    def close(self) -> None:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda p: p.close(), self.procs))


def _diff_counter(before: dict[str, Any], after: dict[str, Any], key: str) -> Counter[str]:
    return Counter(after.get(key, {})) - Counter(before.get(key, {}))


def _stats(values: list[float], digits: int = 4) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), digits),
        "mean": round(statistics.fmean(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
    }


def measure_swarm(swarm: IdleSwarm, measure_s: float) -> dict[str, Any]:
    """One measurement window over a settled swarm (see the module docstring).

    Nodes that exit before or during the window are reported, and left out
    of the figures.
    """
    procs = swarm.alive()
    before = swarm.statuses(procs)
    pids = [p.pid for p in procs]
    meter = TcpByteMeter(pids).start()
    cpu0 = [cpu_seconds(pid) for pid in pids]
    sys0 = [cpu_times(pid)[1] for pid in pids]
    t0 = time.monotonic()
    load0 = os.getloadavg()[0]
    time.sleep(measure_s)
    keep = [i for i, p in enumerate(procs) if p.proc.poll() is None]
    cpu1 = {i: cpu_seconds(pids[i]) for i in keep}
    t1 = time.monotonic()
    net = meter.stop()
    rss = [rss_mib(pids[i]) for i in keep]
    after = swarm.statuses([procs[i] for i in keep])
    seconds = t1 - t0
    cpu = [(cpu1[i] - cpu0[i]) / seconds for i in keep]
    system = [(cpu_times(pids[i])[1] - sys0[i]) / seconds for i in keep]
    out: dict[str, Any] = {
        "seconds": round(seconds, 2),
        "nodes_measured": len(keep),
        "nodes_exited": swarm.exited(),
        "idle_cpu_per_node": round(statistics.median(cpu), 4),
        "idle_cpu_per_node_stats": _stats(cpu),
        "idle_cpu_per_node_all": [round(c, 4) for c in cpu],
        "system_cpu_per_node": round(statistics.median(system), 4),
        "rss_mib_per_node": round(statistics.median(rss), 1),
        "rss_mib_per_node_stats": _stats(rss, 1),
        "load_average_1m": [round(load0, 2), round(os.getloadavg()[0], 2)],
    }
    if net is not None:
        bytes_in = [net[pids[i]][0] / seconds for i in keep]
        bytes_out = [net[pids[i]][1] / seconds for i in keep]
        out["bytes_in_per_node_per_s"] = round(statistics.fmean(bytes_in), 1)
        out["bytes_out_per_node_per_s"] = round(statistics.fmean(bytes_out), 1)
        out["bytes_in_per_node_per_s_max"] = round(max(bytes_in), 1)
        out["bytes_note"] = "TCP payload from tcp_info (ss): Noise, yamux, gossipsub control, pings, pulls included"
        out.update(meter.summary())
    pairs = [(before[i], a) for i, a in zip(keep, after) if before[i] is not None and a is not None]
    kinds: Counter[str] = Counter()
    kind_bytes: Counter[str] = Counter()
    per_node = max(1, len(pairs)) * seconds
    c0 = [b["counters"] for b, _ in pairs]
    c1 = [a["counters"] for _, a in pairs]
    for a, b in zip(c0, c1):
        kinds.update({f"pubsub {k}": v for k, v in _diff_counter(a, b, "pubsub_rpcs_sent").items()})
        kind_bytes.update(_diff_counter(a, b, "pubsub_bytes_sent"))
        for key in ("rtt_probes", "pulls_done", "pulls_served", "gossip_published", "gossip_received", "dials_ok", "dials_failed"):
            kinds[key] += b.get(key, 0) - a.get(key, 0)
    out["messages_per_node_per_s"] = {k: round(v / per_node, 3) for k, v in sorted(kinds.items()) if v}
    out["pubsub_bytes_sent_per_node_per_s"] = {k: round(v / per_node, 1) for k, v in sorted(kind_bytes.items()) if v}
    out["own_gossip_bytes_per_node_per_s"] = {
        "published": round(sum(b["gossip_published_bytes"] - a["gossip_published_bytes"] for a, b in zip(c0, c1)) / per_node, 1),
        "received": round(sum(b["gossip_received_bytes"] - a["gossip_received_bytes"] for a, b in zip(c0, c1)) / per_node, 1),
    }
    out["peers_left_views_in_window"] = {
        key: sum(b.get(key, 0) - a.get(key, 0) for a, b in zip(c0, c1)) for key in ("peers_expired", "peers_disconnected")
    }
    out["gossipsub_mesh_peers"] = _stats([float(a.get("gossip_mesh_peers", 0)) for _, a in pairs] or [0.0], 1)
    return out


def run_idle_bench(
    node_counts: list[int],
    *,
    settle_s: float = 10.0,
    measure_s: float = 20.0,
    repeats: int = 1,
    converge_timeout_s: float | None = None,
    profile_dir: Path | None = None,
    profile_s: float = 20.0,
    progress: Any = None,
    partial: Any = None,
) -> dict[str, Any]:
    """Every node count in turn; ``partial(result_so_far)`` after each (so a crash loses nothing)."""
    from importlib.metadata import version

    say = progress or (lambda _msg: None)

    def result() -> dict[str, Any]:
        return {
            "benchmark": "idle",
            "engine": "simulated (defaults of `p2pinfer node --engine simulated`)",
            "transport": "TCP loopback, Noise, Yamux; one process per node; bootstrap through the first node",
            "settle_s": settle_s,
            "measure_s": measure_s,
            "repeats": repeats,
            "results": results,
            "machine_holds": _capacity(results),
            "machine": {
                "cpus": os.cpu_count(),
                "mem_total_mib": round(_meminfo("MemTotal"), 0),
                "python": platform.python_version(),
                "libp2p": version("libp2p"),
            },
            "provenance": provenance(),
        }

    results: list[dict[str, Any]] = []
    for n in node_counts:
        runs: list[dict[str, Any]] = []
        for rep in range(repeats):
            mem_before = mem_available_mib()
            say(f"{n} nodes, run {rep + 1}/{repeats}: starting")
            t_start = time.monotonic()
            try:
                swarm = IdleSwarm(n)
            except RuntimeError as exc:  # the machine could not even start them: a result too
                say(f"{n} nodes: {exc}")
                runs.append({"error": str(exc), "start_s": round(time.monotonic() - t_start, 1)})
                continue
            try:
                started_s = time.monotonic() - t_start
                timeout = converge_timeout_s if converge_timeout_s is not None else 60.0 + 4.0 * n
                complete_s = swarm.wait_complete(timeout)
                say(f"{n} nodes: started in {started_s:.1f} s, views complete after {complete_s} s; settling {settle_s} s")
                time.sleep(settle_s)
                run = measure_swarm(swarm, measure_s)
                run.update(
                    {
                        "start_s": round(started_s, 1),
                        "views_complete_after_s": None if complete_s is None else round(complete_s, 1),
                        "views_complete_at_end": swarm.views_complete(),
                        "mem_available_mib_before": round(mem_before, 0),
                    }
                )
                if profile_dir is not None and rep == 0:
                    run["profile"] = _profile(swarm, n, profile_dir, profile_s)
                runs.append(run)
                say(f"{n} nodes: idle CPU per node {run['idle_cpu_per_node']:.4f} of a core, "
                    f"{run.get('bytes_in_per_node_per_s')} B/s in")
            finally:
                swarm.close()
        failed = [r for r in runs if "error" in r]
        runs_ok = [r for r in runs if "error" not in r]
        if not runs_ok:
            results.append({"nodes": n, "error": failed[0]["error"], "runs": runs})
            if partial is not None:
                partial(result())
            continue
        entry_runs, runs = runs, runs_ok
        cpus = [r["idle_cpu_per_node"] for r in runs]
        entry: dict[str, Any] = {
            "nodes": n,
            "idle_cpu_per_node": round(statistics.median(cpus), 4),
            "idle_cpu_per_node_over_runs": _stats(cpus),
            "rss_mib_per_node": round(statistics.median(r["rss_mib_per_node"] for r in runs), 1),
            "runs": entry_runs,
            "runs_failed_to_start": len(failed),
        }
        for key in ("bytes_in_per_node_per_s", "bytes_out_per_node_per_s"):
            if all(key in r for r in runs):
                entry[key] = round(statistics.median(r[key] for r in runs), 1)
        entry["messages_per_node_per_s"] = runs[len(runs) // 2]["messages_per_node_per_s"]
        entry["nodes_exited"] = sum(len(r["nodes_exited"]) for r in runs)
        entry["views_complete"] = all(r["views_complete_at_end"] for r in runs)
        results.append(entry)
        if partial is not None:
            partial(result())
    return result()


def _meminfo(key: str) -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def _capacity(results: list[dict[str, Any]]) -> dict[str, Any]:
    """How many idle node processes this machine holds, and what limits it."""
    measured = [r for r in results if "error" not in r]
    if not measured:
        return {"note": "no swarm could be measured"}
    failed = [r["nodes"] for r in results if "error" in r]
    big = max(measured, key=lambda r: r["nodes"])
    cores = os.cpu_count() or 1
    rss = big["rss_mib_per_node"]
    cpu = big["idle_cpu_per_node"]
    return {
        "largest_swarm_measured": big["nodes"],
        "swarms_that_did_not_start": failed,
        "its_views_complete": all(r.get("views_complete_at_end") for r in big["runs"] if "error" not in r),
        "its_nodes_exited": big.get("nodes_exited", 0),
        "by_memory": int(_meminfo("MemTotal") * 0.8 // rss) if rss else None,
        "by_idle_cpu_at_half_the_cores": int(0.5 * cores // cpu) if cpu > 0 else None,
        "note": (
            f"by_memory: 80 % of this machine's memory over the resident memory of a node at {big['nodes']} nodes; "
            f"by_idle_cpu: half of its {cores} cores over the idle CPU of a node at that size (an idle cost that grows "
            "with the swarm lowers it further)"
        ),
    }


def _profile(swarm: IdleSwarm, n: int, profile_dir: Path, seconds: float) -> dict[str, Any]:
    exe = _pyspy()
    if exe is None:
        return {"error": "py-spy not found (pip install py-spy)"}
    profile_dir.mkdir(parents=True, exist_ok=True)
    raw = profile_dir / f"idle-{n}-nodes-node0.txt"
    cmd = [exe, "record", "-r", "100", "-d", str(int(seconds)), "-p", str(swarm.alive()[0].pid), "-f", "raw", "-o", str(raw)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not raw.exists():
        return {"error": f"py-spy failed: {done.stderr.strip()[-500:]}"}
    cpu = cpu_seconds(swarm.alive()[0].pid)
    summary = summarize_pyspy_raw(raw)
    return {"command": " ".join(cmd[1:]), "raw": str(raw), "node_cpu_seconds_at_end": round(cpu, 2),
            "busy_share_of_samples": round(summary.get("samples", 0) / (100 * seconds), 4), **summary}
