"""``p2pinfer lab nat``: prefix-aware routing across NATs, on the namespace testbed.

Public relay nodes on the "WAN" and volunteers behind NAT routers
(:mod:`p2pinfer.lab.nat_testbed`), every one a real node process with the
simulated engine (the calibrated cost model, real radix caches). One
volunteer behind a port-preserving NAT, the *holder*, caches a prefix;
requests for it enter at every other node, so each must be forwarded to
the holder: over the LAN, over the holder's own connection to a public
node, through a relay, or over a hole-punched connection. Then the relay
that carries the holder's relayed circuits is killed (SIGKILL) while
requests keep coming.

Measured, all in one run: requests served by the holder, failed ones, the
path of each pair, hole punches per NAT type, the overhead of each
forward (the time the entry node waited minus the time the holder's engine
took) by path and its excess over a direct forward (p50, p90), relay bytes
per request, the time a volunteer needs to become reachable (hold a
reservation) after it starts and after its relay is killed, and (with a third
public relay, ``--public 3``) the time until it holds two reservations again.
Each request's record says why it was served where it was (the entry's
reason, the candidates it ranked, the engine's queue time, every attempt).
Before the measured phase each entry forwards to the holder until it
releases an answer unchecked (its probation of a new peer, see
:func:`_probation_warmup`); the overhead figures leave out answers checked by
the entry before their result (``held_for_check`` counts them).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
import random
import sys
import tempfile
import time
from typing import Any

from ..core.costmodel import EngineCostModel
from ..stats import percentile, rounded
from .nat_testbed import NatHost, NatTestbed

__all__ = ["NatSwarm", "run_nat_bench"]

PORT = 4001
"""The first host's listen port; each host gets its own (``PORT + i``).

Two volunteers behind one port-preserving NAT listening on the same port
would both predict the same external address (the NAT's WAN address with
that port) for hole punching, and only one can own that mapping: the
other's hole punches fail for a reason that says nothing about NATs. Home
users' nodes do not share a port either (each picks one, or a random one)."""


def _p(values: list[float], q: float) -> float | None:
    """The published figure: linear-interpolated ``q``-th percentile in ms, 3 decimals, None for none."""
    return rounded(percentile(values, q, method="linear"), 3)


LAB_GOSSIP = {"delta_interval_s": 0.5, "full_interval_s": 10.0, "load_interval_s": 2.0, "keepalive_interval_s": 5.0, "peer_ttl_s": 15.0}
"""A calm gossip schedule: seven or eight node processes share two cores here,
and py-libp2p spends most of a node's CPU on gossip RPCs (each carries and
verifies a signed peer record; each read is credited with its own yamux
window update). NAT traversal does not depend on it."""


def _node_config(host: NatHost, port: int, bootstrap: tuple[str, ...], speed: float, nat: dict[str, Any]) -> Any:
    from ..core.router import GossipConfig
    from ..net.config import NatConfig
    from .node_process import NO_CHECK_CACHE, fast_config

    return fast_config(
        bootstrap=bootstrap,
        speed=speed,
        # No check cache: an entry that checks the holder's probation answers would keep
        # the checked prompt and serve every later request itself, and no forward (the
        # paths this benchmark measures) would be left (as at c9cb747: 0 of 60 at the holder).
        engine_options=NO_CHECK_CACHE,
        gossip=GossipConfig(**LAB_GOSSIP),
        connect_timeout_s=10.0,
        stall_timeout_s=30.0,
        request_timeout_s=120.0,
    ).replace(listen=(f"/ip4/{host.ip}/tcp/{port}",), nat=NatConfig(**nat))


class NatSwarm:
    """A real node process on every host of a :class:`NatTestbed` (the first public host bootstraps).

    Used by the benchmark and by the testbed's tests (tests/netns).
    """

    def __init__(self, bed: NatTestbed, speed: float, nat: dict[str, Any], log_dir: Path) -> None:
        from .node_process import NodeProcess

        self.bed = bed
        self.nodes: dict[str, Any] = {}
        pubs = bed.public_hosts
        first = pubs[0]
        ports = {h.name: PORT + i for i, h in enumerate(bed.hosts.values())}
        self.nodes[first.name] = NodeProcess(
            _node_config(first, ports[first.name], (), speed, nat), first.name, log_dir=log_dir, wrap=first.wrap, start_timeout_s=120
        )
        boot = (self.nodes[first.name].addrs[0],)
        rest = [*pubs[1:], *bed.private_hosts]
        with ThreadPoolExecutor(len(rest) or 1) as pool:
            futures = {
                h.name: pool.submit(
                    NodeProcess, _node_config(h, ports[h.name], boot, speed, nat), h.name, log_dir, 120.0, wrap=h.wrap
                )
                for h in rest
            }
            for name, fut in futures.items():
                self.nodes[name] = fut.result()
        self.ids = {name: n.peer_id for name, n in self.nodes.items()}
        self.names = {pid: name for name, pid in self.ids.items()}
        self.dead: set[str] = set()

    def live(self) -> dict[str, Any]:
        return {n: p for n, p in self.nodes.items() if n not in self.dead}

    def nat(self) -> dict[str, dict[str, Any]]:
        return {name: node.call("nat", timeout_s=60) for name, node in self.live().items()}

    def kill(self, name: str) -> None:
        """SIGKILL one node (a relay that disappears)."""
        self.nodes[name].kill()
        self.dead.add(name)

    def unsettled(self, wanted_reservations: int) -> list[str]:
        """What keeps the swarm from being ready; empty when it is.

        Ready: every volunteer knows it is private and holds ``wanted_reservations``
        reservations and a connection to every other node (direct, hole-punched
        or relayed); every public node knows it is public and offers its relay.
        """
        facts = self.nat()
        missing: list[str] = []
        for name, f in facts.items():
            if self.bed.host(name).public:
                if f["reachability"] != "public" or not f["relay"]["offered"]:
                    missing.append(f"{name} is {f['reachability']}, relay offered: {f['relay']['offered']}")
                continue
            if f["reachability"] != "private":
                missing.append(f"{name} is {f['reachability']}")
            if len(f["reservations"]) < wanted_reservations:
                missing.append(f"{name} holds {len(f['reservations'])} reservations")
            absent = [o for o in self.live() if o != name and self.ids[o] not in f["paths"]]
            if absent:
                missing.append(f"{name} not connected to {', '.join(absent)}")
        return missing

    def settle(self, wanted_reservations: int, timeout_s: float) -> float:
        """Until :meth:`unsettled` is empty; returns the seconds it took (TimeoutError says what is missing)."""
        t0 = time.monotonic()
        missing: list[str] = []
        while True:
            missing = self.unsettled(wanted_reservations)
            if not missing:
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout_s:
                raise TimeoutError(f"the swarm did not settle within {timeout_s} s: {'; '.join(missing)}")
            time.sleep(1.0)

    def close(self) -> None:
        for name, node in self.nodes.items():
            if name not in self.dead:
                node.close()


def _kind(bed: NatTestbed, name: str) -> str:
    host = bed.host(name)
    return "public" if host.public else str(host.nat_kind)


def run_nat_bench(
    *,
    public: int = 2,
    nats: tuple[str, ...] = ("cone", "cone", "symmetric"),
    hosts_per_nat: tuple[int, ...] = (1, 1, 2),
    requests: int = 60,
    kill_requests: int = 30,
    rate_rps: float = 3.0,
    prefix_tokens: int = 1024,
    suffix_tokens: int = 32,
    max_tokens: int = 8,
    speed: float = 1.0,
    seed: int = 0,
    settle_timeout_s: float = 180.0,
    progress: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr, flush=True),
) -> dict[str, Any]:
    """Run the NAT benchmark; returns one JSON-ready object (see the module docstring)."""
    from .node_process import wait_until

    rng = random.Random(seed)
    nat_cfg: dict[str, Any] = {"reachability_interval_s": 60.0}
    log_dir = Path(tempfile.mkdtemp(prefix="p2pinfer-lab-nat-"))
    with NatTestbed(public=public, nats=tuple(nats), hosts_per_nat=tuple(hosts_per_nat)) as bed:  # type: ignore[arg-type]
        progress(f"testbed {bed.run_id}: {len(bed.public_hosts)} public hosts, NATs {', '.join(nats)}")
        swarm = NatSwarm(bed, speed, nat_cfg, log_dir)
        try:
            return _run(bed, swarm, rng, requests=requests, kill_requests=kill_requests, rate_rps=rate_rps,
                        prefix_tokens=prefix_tokens, suffix_tokens=suffix_tokens, max_tokens=max_tokens,
                        settle_timeout_s=settle_timeout_s, nat_cfg=nat_cfg, progress=progress, wait_until=wait_until,
                        log_dir=log_dir, speed=speed)
        finally:
            swarm.close()


def _run(bed: NatTestbed, swarm: NatSwarm, rng: random.Random, *, requests: int, kill_requests: int, rate_rps: float,
         prefix_tokens: int, suffix_tokens: int, max_tokens: int, settle_timeout_s: float, nat_cfg: dict[str, Any],
         progress: Callable[[str], None], wait_until: Any, log_dir: Path, speed: float) -> dict[str, Any]:
    private = [h.name for h in bed.private_hosts]
    publics = [h.name for h in bed.public_hosts]
    holder = next(h.name for h in bed.private_hosts if h.nat_kind == "cone")
    wanted = min(2, len(publics))

    progress(f"waiting for reachability verdicts, reservations and connections (node logs in {log_dir})")
    settle_s = swarm.settle(wanted, settle_timeout_s)
    progress(f"settled after {settle_s:.1f} s")
    start_facts = swarm.nat()
    reachable_after_start = {}
    for name, f in start_facts.items():
        at = f["first_reserved_at"] if name in private else f["reachability_changed_at"]
        reachable_after_start[name] = None if at is None else round(at - f["started_at"], 3)

    # The holder caches a prefix, served locally; everyone hears of it.
    prefix = [rng.randrange(1000, 40000) for _ in range(prefix_tokens)]
    swarm.nodes[holder].call("generate", tokens=prefix + [rng.randrange(1000, 40000) for _ in range(suffix_tokens)],
                             max_tokens=1, prefer="local", timeout_s=120)
    blocks = prefix_tokens // 16
    entries = [n for n in swarm.nodes if n != holder]

    def heard() -> bool:
        for name in entries:
            view = swarm.nodes[name].call("view")
            if view.get(swarm.ids[holder], {}).get("blocks", 0) < blocks:
                return False
        return True

    wait_until(heard, 60, interval_s=0.5, what="every entry node heard the holder's digest")
    # Hole punches started when the relayed connections came up: let them finish.
    time.sleep(5)
    warmup = _probation_warmup(swarm, entries, holder, prefix, rng, suffix_tokens, max_tokens)
    rtts = {name: swarm.nodes[name].call("status")["peers"] for name in entries}

    # The idle window starts here, after the warm-up: counting from start_facts would put the
    # hole punches and the warm-up's relayed forwards into "idle" bytes over a 10 s window.
    pre_idle = swarm.nat()
    relay_before = {p: pre_idle[p]["relay"]["bytes_relayed"] for p in publics}
    t_idle = time.monotonic()
    time.sleep(10)
    idle_facts = swarm.nat()
    idle_bytes = sum(idle_facts[p]["relay"]["bytes_relayed"] - relay_before[p] for p in publics)
    idle_rate = idle_bytes / (time.monotonic() - t_idle)

    progress(f"{requests} requests at {rate_rps}/s entering at {len(entries)} nodes")
    t_phase = time.monotonic()
    before = {p: idle_facts[p]["relay"]["bytes_relayed"] for p in publics}
    records = _requests(swarm, entries, prefix, rng, requests, rate_rps, suffix_tokens, max_tokens)
    phase_s = time.monotonic() - t_phase
    after_facts = swarm.nat()
    relay_bytes = sum(after_facts[p]["relay"]["bytes_relayed"] - before[p] for p in publics)

    # -- the relay carrying the holder's circuits dies mid-run ----------------------------
    victim = max(publics, key=lambda p: (
        sum(1 for c in after_facts[p]["relay"]["circuits"] if c["dst"] == swarm.ids[holder]),
        swarm.ids[p] in after_facts[holder]["reservations"]))
    kill = {"relay": victim}
    kill_records: list[dict[str, Any]] = []
    if kill_requests and len(publics) > 1:
        progress(f"{kill_requests} more requests; relay {victim} is killed halfway")

        def killer() -> float:
            time.sleep(kill_requests / rate_rps / 2)
            at = time.monotonic()  # stamped first: a peer may notice before kill() returns
            swarm.kill(victim)
            return at

        with ThreadPoolExecutor(1) as pool:
            fut = pool.submit(killer)
            kill_records = _requests(swarm, [e for e in entries if e != victim], prefix, rng, kill_requests,
                                     rate_rps, suffix_tokens, max_tokens, skip=lambda name: name in swarm.dead)
            killed_at = fut.result()
        # The dead relay noticed and dropped; a new reservation taken where another relay was free.
        def dropped() -> bool:
            facts = swarm.nat()
            return all(swarm.ids[victim] not in facts[n]["reservations"] and facts[n]["reservations"] for n in private)

        try:
            wait_until(dropped, 90, interval_s=0.5, what="reservations moved off the killed relay")
        except TimeoutError as exc:
            kill["not_replaced"] = str(exc)
        # Where a live relay holds none of its reservations, each volunteer that lost one takes a new one.
        restorable = len(publics) - 1 >= wanted

        def restored() -> bool:
            facts = swarm.nat()
            return all(len(facts[n]["reservations"]) >= wanted for n in private)

        if restorable:
            try:
                wait_until(restored, 120, interval_s=0.5, what=f"every volunteer holding {wanted} reservations again")
            except TimeoutError as exc:
                kill["not_restored"] = str(exc)
        facts = swarm.nat()
        lost_after: dict[str, float | None] = {}
        reserved_after: dict[str, float | None] = {}
        restored_after: dict[str, float | None] = {}
        restored_passes: dict[str, int | None] = {}
        for n in private:
            events = _merged_events(start_facts[n]["relay_events"], facts[n]["relay_events"])
            had = any(e["relay"] == swarm.ids[victim] and e["event"] in ("reserved", "renewed") and e["t"] < killed_at
                      for e in events)
            if not had:
                continue
            lost = [e for e in events if e["relay"] == swarm.ids[victim] and e["event"] == "lost" and e["t"] > killed_at]
            later = [e["t"] for e in events if e["event"] == "reserved" and e["t"] > killed_at]
            lost_after[n] = round(lost[0]["t"] - killed_at, 3) if lost else None
            reserved_after[n] = round(min(later) - killed_at, 3) if later else None
            back = _held_again(events, killed_at, wanted)
            restored_after[n] = None if back is None else round(back["t"] - killed_at, 3)
            restored_passes[n] = None if back is None or not lost else back["pass"] - lost[0]["pass"]
        kill["reservation_dropped_after_s"] = lost_after
        kill["new_reservation_after_s"] = reserved_after
        kill["reservations_restored_after_s"] = restored_after
        kill["reservations_restored_after_passes"] = restored_passes
        kill["reservations_after"] = {n: len(facts[n]["reservations"]) for n in private}
        kill["note"] = (
            f"per volunteer that held a reservation on the killed relay: seconds from the kill until it noticed "
            f"(reservation_dropped_after_s), until its next new reservation (new_reservation_after_s) and until it "
            f"held {wanted} reservations again (reservations_restored_after_s; null: it never did while measured), "
            f"and the reservation keeper's passes (at most one per second) from the loss to that; "
            + ("a relay without one of its reservations was alive, so each had one to move to"
               if restorable else "no relay without one of its reservations was left, so each keeps its other one only")
        )
        holder_after = [r for r in kill_records if r.get("done_at", 0) > killed_at and r.get("served_by") == swarm.ids[holder]
                        and r.get("path") == "relayed"]
        kill["first_relayed_holder_serve_after_s"] = (
            round(min(r["done_at"] for r in holder_after) - killed_at, 3) if holder_after else None
        )
        kill["requests"] = len(kill_records)
        kill["failed"] = sum(1 for r in kill_records if "error" in r)
        kill["served_by_holder"] = sum(1 for r in kill_records if r.get("served_by") == swarm.ids[holder])
        kill["fallbacks"] = sum(1 for r in kill_records if len(r.get("attempts", [])) > 1)
    final = swarm.nat()
    out = _report(bed, swarm, holder, records, kill_records, kill, start_facts, final, rtts,
                   reachable_after_start, relay_bytes, idle_rate, phase_s, nat_cfg, requests, rate_rps,
                   prefix_tokens, suffix_tokens, max_tokens, speed)
    out["settled_after_s"] = round(settle_s, 3)
    out["probation_warmup"] = warmup
    return out


def _probation_warmup(swarm: NatSwarm, entries: list[str], holder: str, prefix: list[int], rng: random.Random,
                      suffix_tokens: int, max_tokens: int, most: int = 6) -> dict[str, Any]:
    """Each entry sends the holder forwards, one at a time, until it releases an answer unchecked.

    A node checks a new peer's first answers (``VerifyConfig.probation_answers``) by recomputing
    them on its own engine before it releases them: with a 1,024-token prefix that is a full
    prefill per answer, and answers queued behind each other's checks. That is the cost of
    meeting a peer, not of its path; done here, the measured phase sees the paths. What it cost
    is reported (``probation_warmup``), and the phase's overhead figures still leave out any
    checked answer (``VerifyConfig.fraction`` of a trusted peer's answers are checked too, and the
    result waits for that check as well).
    """
    suffixes = {e: [[rng.randrange(1000, 40000) for _ in range(suffix_tokens)] for _ in range(most)] for e in entries}

    def one(entry: str) -> dict[str, Any]:
        calls: list[dict[str, Any]] = []
        for suffix in suffixes[entry]:
            r = swarm.nodes[entry].call("generate", tokens=prefix + suffix, max_tokens=max_tokens,
                                        prefer=swarm.ids[holder], deadline_s=120, timeout_s=180)
            held = sum(a.get("held_tokens", 0) for a in r["attempts"])
            calls.append({"call_s": round(r["call_s"], 3), "held_tokens": held,
                          "checks": [a.get("check", "") for a in r["attempts"]]})
            if r["served_by"] == swarm.ids[holder] and not held:
                return {"forwards": len(calls), "released_unchecked": True, "calls": calls}
        return {"forwards": len(calls), "released_unchecked": False, "calls": calls}

    with ThreadPoolExecutor(len(entries)) as pool:
        return dict(zip(entries, pool.map(one, entries)))


def _merged_events(*lists: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A node's reservation events from several reads of its (bounded) log, once each, in time order."""
    seen: dict[tuple[Any, ...], dict[str, Any]] = {}
    for events in lists:
        for e in events:
            seen.setdefault((e["t"], e["event"], e["relay"]), e)
    return sorted(seen.values(), key=lambda e: e["t"])


def _held_again(events: list[dict[str, Any]], after: float, wanted: int) -> dict[str, Any] | None:
    """The event after ``after`` at which the node held ``wanted`` reservations again, having held fewer."""
    held: set[str] = set()
    short = False
    for e in events:
        if e["event"] in ("reserved", "renewed"):
            held.add(e["relay"])
        elif e["event"] == "lost":
            held.discard(e["relay"])
        if e["t"] <= after:
            continue
        if len(held) < wanted:
            short = True
        elif short:
            return e
    return None


def _requests(swarm: NatSwarm, entries: list[str], prefix: list[int], rng: random.Random, n: int, rate: float,
              suffix_tokens: int, max_tokens: int, skip: Callable[[str], bool] = lambda name: False) -> list[dict[str, Any]]:
    pending = []
    t0 = time.monotonic()
    for i in range(n):
        delay = t0 + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        entry = entries[i % len(entries)]
        if skip(entry):
            continue
        tokens = prefix + [rng.randrange(1000, 40000) for _ in range(suffix_tokens)]
        pending.append((entry, swarm.nodes[entry].start_call("generate", tokens=tokens, max_tokens=max_tokens,
                                                             deadline_s=120)))
    out = []
    for entry, wait in pending:
        try:
            result = wait(180)
            result["entry"] = entry
        except Exception as exc:  # a failed request is a result, reported
            result = {"entry": entry, "error": str(exc)[:500]}
        out.append(result)
    return out


def _record(r: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """One request, with why it was served where it was: the entry's reason and the candidates it ranked
    (estimated TTFT, RTT, queue and prefill, in ms), the serving engine's queue time, each attempt."""
    record = r.get("record") or {}
    decision = r.get("decision") or {}
    return {k: r.get(k) for k in ("entry", "served_by", "path", "call_s", "predicted_reused_tokens", "reused_tokens", "error")} | {
        "engine_s": record.get("total_s"),
        "engine_queue_s": record.get("queue_s"),
        "reason": r.get("reason"),
        "candidates": [{"target": names.get(c["target"], c["target"]),
                        **{k: c[k] for k in ("predicted_match_tokens", "est_ttft_ms", "rtt_ms", "queue_ms", "prefill_ms")}}
                       for c in decision.get("candidates", [])],
        "attempts": [(a["target"][-6:], a["outcome"], a["path"], (a.get("message") or "")[:200], a.get("check", ""),
                      a.get("held_tokens", 0), a.get("stream_bytes", 0)) for a in r.get("attempts", [])],
    }


def _report(bed: NatTestbed, swarm: NatSwarm, holder: str, records: list[dict[str, Any]], kill_records: list[dict[str, Any]],
            kill: dict[str, Any], start: dict[str, Any], final: dict[str, Any], rtts: dict[str, Any],
            reachable_after_start: dict[str, Any], relay_bytes: int, idle_rate: float, phase_s: float,
            nat_cfg: dict[str, Any], requests: int, rate_rps: float, prefix_tokens: int, suffix_tokens: int,
            max_tokens: int, speed: float) -> dict[str, Any]:
    from .node_process import NO_CHECK_CACHE

    hid = swarm.ids[holder]
    ok = [r for r in records if "error" not in r]
    by_path: dict[str, list[float]] = {}
    pairs: dict[str, Any] = {}
    held_for_check = 0
    for r in ok:
        if r["served_by"] != hid:
            continue
        if any(a.get("held_tokens") or a.get("check") for a in r["attempts"]):
            # Checked (a probation answer, or one of the share of trusted peers' answers that is
            # sampled): its result waited for the entry's own recompute, which is not the path's time.
            held_for_check += 1
            continue
        overhead = (r["call_s"] - r["record"]["total_s"]) * 1000
        by_path.setdefault(r["path"], []).append(overhead)
        pair = pairs.setdefault(f"{r['entry']}->{holder}", {"paths": {}, "overhead_ms": []})
        pair["paths"][r["path"]] = pair["paths"].get(r["path"], 0) + 1
        pair["overhead_ms"].append(overhead)
    for pair in pairs.values():
        pair["overhead_ms_p50"] = _p(pair.pop("overhead_ms"), 50)
    direct = by_path.get("direct", [])
    added_p50 = {p: None if not direct else round(_p(v, 50) - _p(direct, 50), 3) for p, v in by_path.items() if p != "direct"}
    added_p90 = {p: None if not direct else round(_p(v, 90) - _p(direct, 90), 3) for p, v in by_path.items() if p != "direct"}
    relayed_requests = sum(1 for r in ok if r.get("path") == "relayed")
    # What each relayed forward put on its circuit, counted by the entry on the stream itself (request
    # and answer frames; the relay adds Noise and yamux framing), so the relays' idle traffic is not in it.
    relayed_stream_bytes = [sum(a.get("stream_bytes", 0) for a in r["attempts"] if a.get("path") == "relayed")
                            for r in ok if r.get("path") == "relayed"]
    # Paths between every pair of nodes, as each node names them.
    paths = {f"{a}->{swarm.names.get(p, p[:12])}": path for a, f in final.items() for p, path in f["paths"].items()}
    rtt = {}
    for entry, peers in rtts.items():
        for p in peers:
            if p["peer_id"] in swarm.names and p["rtt_ms"] is not None:
                rtt[f"{entry}->{swarm.names[p['peer_id']]}"] = {"rtt_ms": p["rtt_ms"], "path": p["rtt_path"]}
    # Hole punches by the NAT kinds of the two ends (a pair counts once; ok if any attempt worked).
    punches: dict[tuple[str, str], dict[str, Any]] = {}
    for name, f in {**start, **final}.items():
        for rec in f["hole_punches"]:
            other = swarm.names.get(rec["peer"])
            if other is None:
                continue
            key = tuple(sorted((name, other)))
            entry = punches.setdefault(key, {"attempts": 0, "ok": False, "seconds": []})  # type: ignore[arg-type]
            entry["attempts"] += 1
            entry["ok"] = entry["ok"] or rec["ok"]
            entry["seconds"].append(round(rec["seconds"], 3))
    per_kind: dict[str, dict[str, Any]] = {}
    for (a, b), e in punches.items():
        kind = "-".join(sorted((_kind(bed, a), _kind(bed, b))))
        k = per_kind.setdefault(kind, {"pairs": 0, "succeeded": 0, "attempts": 0})
        k["pairs"] += 1
        k["succeeded"] += int(e["ok"])
        k["attempts"] += e["attempts"]
    for k in per_kind.values():
        k["success_rate"] = round(k["succeeded"] / k["pairs"], 3)
    reuse_equal = sum(1 for r in ok if r["served_by"] == hid and r["reused_tokens"] == r["predicted_reused_tokens"])
    return {
        "benchmark": "lab nat",
        "requests": len(records),
        "served_by_holder": sum(1 for r in ok if r["served_by"] == hid),
        "failed": len(records) - len(ok),
        "reuse_equal_to_prediction": reuse_equal,
        "holder": holder,
        "paths": paths,
        "request_paths": {p: len(v) for p, v in by_path.items()},
        "held_for_check": held_for_check,
        "pairs": pairs,
        "overhead_ms_p50": {p: _p(v, 50) for p, v in by_path.items()},
        "overhead_ms_p90": {p: _p(v, 90) for p, v in by_path.items()},
        "added_ms_p50": added_p50,
        "added_ms_p90": added_p90,
        "rtt_ms": rtt,
        "hole_punch": {"by_nat_kinds": per_kind,
                       "pairs": {f"{a}<->{b}": e for (a, b), e in punches.items()}},
        "relay_bytes": {
            "request_phase": relay_bytes,
            "request_phase_s": round(phase_s, 3),
            "idle_bytes_per_s": round(idle_rate, 1),
            "relayed_requests": relayed_requests,
            "per_relayed_request": None if not relayed_requests else round(relay_bytes / relayed_requests),
            "per_relayed_request_less_idle": None if not relayed_requests
            else round((relay_bytes - idle_rate * phase_s) / relayed_requests),
            "forward_stream_bytes_per_relayed_request_p50": _p(relayed_stream_bytes, 50),
            "forward_stream_bytes_per_relayed_request_max": max(relayed_stream_bytes, default=None),
        },
        "reachable_after_start_s": reachable_after_start,
        "relay_kill": kill,
        "reachability": {n: f["reachability"] for n, f in final.items()},
        "testbed": bed.describe(),
        "config": {
            "requests": requests, "rate_rps": rate_rps, "prefix_tokens": prefix_tokens, "suffix_tokens": suffix_tokens,
            "max_tokens": max_tokens, "engine": f"simulated (calibrated cost model, speed {speed})", "engine_options": dict(NO_CHECK_CACHE), "nat": nat_cfg,
            "cost_model": EngineCostModel().scaled(speed).as_dict(),
        },
        "records": [_record(r, swarm.names) for r in records + kill_records],
        "node_names": swarm.names,
    }
