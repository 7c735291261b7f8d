"""Turning a finished run into the figures we report.

Wall-clock figures (``decision_us_*``, ``sim.wall_s``) are the only ones
that differ between two runs with the same seed; everything else is a
function of the seed and the configuration.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict
import json
import statistics
from typing import Any, Protocol

from ..core.directory import Rendezvous
from ..stats import percentile
from ..workloads.base import PromptEncoder
from .model import Req, SimConfig, SimNode
from .network import LatencyModel, gossip_copies, mesh_hops

__all__ = ["WALL_CLOCK_KEYS", "FinishedRun", "percentile", "summarise", "without_wall_clock"]

WALL_CLOCK_KEYS = ("decision_us_p50", "decision_us_p99", "directory_query_us_p50", "wall_s")


def without_wall_clock(result: dict[str, Any]) -> dict[str, Any]:
    """A copy of a run's result without its wall-clock figures (and without the
    ``provenance`` the CLI adds: when and where it ran): what two runs with the
    same seed must agree on exactly."""
    out: dict[str, Any] = json.loads(json.dumps(result))
    out.pop("provenance", None)
    for key in WALL_CLOCK_KEYS:
        out.pop(key, None)
        out["sim"].pop(key, None)
    return out


class FinishedRun(Protocol):
    """What the figures are computed from: a :class:`~p2pinfer.sim.simulator.Simulator` after ``run()``."""

    config: SimConfig
    encoder: PromptEncoder
    workload: dict[str, Any]
    latency: LatencyModel
    nodes: list[SimNode]
    completed: list[Req]
    now: float
    events: int
    gossip_on: bool
    dir_on: bool
    decision_ns: list[int]
    shadow_total: int
    shadow_agree: int
    refusals: int
    failures: int
    retries: int
    orphaned: int
    joins: int
    leaves: int
    bytes_in: int
    deliveries: int
    lost: int
    msg_count: Counter[str]
    msg_bytes: Counter[str]
    msg_bytes_in: Counter[str]
    apply_results: Counter[str]
    membership: Rendezvous
    lookup_ms: list[float]
    query_ns: list[int]
    dir_count: Counter[str]
    dir_bytes: Counter[str]
    dir_lost: int
    dir_timeouts: int
    dir_blind: int
    dir_answered: int
    dir_empty: int
    dht_on: bool
    dht_lookups: Counter[str]
    dht_find_nodes: int
    check_stats: Counter[str]

    def hashed_topics_summary(self) -> dict[str, Any]: ...


def _r(x: float, nd: int = 3) -> float:
    return round(x, nd)


def _checks_summary(sim: FinishedRun, measured: list[Any]) -> dict[str, Any] | None:
    """With ``SimConfig.verify``: the checks' counts, and the forwarded requests'
    mean TTFT split by whether the entry held the answer (as ``bench directory``'s live split)."""
    cfg = sim.config
    if cfg.verify is None:
        return None

    def mean_ttft(rs: list[Any]) -> float | None:
        return _r(statistics.fmean((r.first_token - r.arrival) * 1000.0 for r in rs)) if rs else None

    forwarded = [r for r in measured if r.served_by is not r.entry]
    held = [r for r in forwarded if r.check == "hold"]
    return {
        "config": asdict(cfg.verify),
        "check_cache": cfg.check_cache,
        "counts": dict(sorted(sim.check_stats.items())),
        "forwarded_held": len(held),
        "ttft_ms_mean_forwarded_held": mean_ttft(held),
        "ttft_ms_mean_forwarded_unheld": mean_ttft([r for r in forwarded if r.check != "hold"]),
        "not_modelled": "delegated spot checks (the entry checks), check deadlines, dishonest peers (every check passes)",
    }


def summarise(sim: FinishedRun, wall_s: float) -> dict[str, Any]:
    cfg = sim.config
    done = sorted(sim.completed, key=lambda r: r.rid)
    skip = int(len(done) * cfg.warmup)
    measured = [r for r in done if r.rid >= skip]
    ttft = sorted((r.first_token - r.arrival) * 1000.0 for r in measured)  # type: ignore[operator]
    prompt = sum(r.n_tokens for r in measured)
    reused = sum(r.reused for r in measured)
    forwarded = sum(1 for r in measured if r.served_by is not r.entry)
    end = sim.now
    node_seconds = sum(((n.left_at if n.left_at is not None else end) - n.joined_at) for n in sim.nodes) or 1.0
    util = [n.busy_s / max(1e-9, (n.left_at if n.left_at is not None else end) - n.joined_at) for n in sim.nodes]
    served = [n.served for n in sim.nodes]
    busy = [n.busy_s for n in sim.nodes]
    decisions = sorted(sim.decision_ns)
    topic_n = cfg.topic_nodes()
    bytes_in = sim.bytes_in + sum(sim.dir_bytes.values())
    node_rates = sorted(
        n.bytes_in / max(1e-9, (n.left_at if n.left_at is not None else end) - n.joined_at) for n in sim.nodes
    )
    busiest = max(sim.nodes, key=lambda n: (n.bytes_in / max(1e-9, (n.left_at if n.left_at is not None else end) - n.joined_at), -n.idx))
    published = sum(sim.msg_count.values())
    under = sum(1 for r in measured if r.served_by is not r.entry and r.reused < r.predicted)
    result: dict[str, Any] = {
        "policy": cfg.policy,
        "nodes": cfg.nodes,
        "requests": len(done),
        "measured_requests": len(measured),
        "workload": sim.workload,
        "tokenizer": sim.encoder.tokenizer.as_dict(),
        "ttft_ms": {
            "mean": _r(statistics.fmean(ttft)),
            "p50": _r(percentile(ttft, 50)),
            "p90": _r(percentile(ttft, 90)),
            "p99": _r(percentile(ttft, 99)),
            "max": _r(ttft[-1]),
        },
        "hit_rate": _r(reused / prompt, 4) if prompt else 0.0,
        "forwarded_share": _r(forwarded / len(measured), 4),
        "forwards_realised_below_prediction": under,
        "busy_refusals": sim.refusals,
        "failed_forwards": sim.failures,
        "client_retries": sim.retries,
        "orphaned_jobs": sim.orphaned,
        "gossip_bytes_per_node_per_s": _r(bytes_in / node_seconds, 1) if sim.gossip_on else None,
        "discovery": _discovery(sim, node_seconds, node_rates, busiest) if sim.gossip_on else None,
        "gossip": {
            "published_wire_bytes_per_node_per_s": _r(sum(sim.msg_bytes.values()) / node_seconds, 1),
            "published_messages_per_node_per_s": _r(published / node_seconds, 3),
            "by_kind": {
                k: {"messages": sim.msg_count[k], "mean_wire_bytes": _r(sim.msg_bytes[k] / sim.msg_count[k], 1)}
                for k in sorted(sim.msg_count)
            },
            "deliveries": sim.deliveries,
            "lost": sim.lost,
            "digest_results": dict(sorted(sim.apply_results.items())),
            "model": {
                "mesh_degree": cfg.mesh_degree,
                "topic_nodes": topic_n,
                "copies_per_receiver": gossip_copies(topic_n, cfg.mesh_degree),
                "mesh_hops": mesh_hops(topic_n, cfg.mesh_degree),
                "envelope_bytes": cfg.envelope_bytes,
                "counted": "inbound bytes per node: copies x (GossipMessage + envelope); IHAVE/IWANT not counted",
            }
            if sim.gossip_on
            else "oracle: a central router with perfect knowledge, no gossip",
        },
        "decision_us_p50": _r(percentile(decisions, 50) / 1000.0, 2),
        "decision_wait_ms": _lookup_summary(sim),
        "directory_query_us_p50": _r(percentile(sorted(sim.query_ns), 50) / 1000.0, 2) if sim.query_ns else None,
        "decision_us_p99": _r(percentile(decisions, 99) / 1000.0, 2),
        "load": {
            "utilisation_mean": _r(statistics.fmean(util), 4),
            "utilisation_max": _r(max(util), 4),
            "busy_max_over_mean": _r(max(busy) / statistics.fmean(busy), 3) if any(busy) else None,
            "served_max_over_mean": _r(max(served) / statistics.fmean(served), 3) if any(served) else None,
        },
        "churn": {"leaves": sim.leaves, "joins": sim.joins},
        "answer_checks": _checks_summary(sim, measured),
        "cost_model": cfg.cost.as_dict(),
        "params": {
            "latency": sim.latency.describe(),
            "forward_cost": "2 one-way hops: request out, first token back",
            "loss": cfg.loss,
            "cache_tokens_per_node": cfg.cache_tokens,
            "reply_cache": cfg.reply_cache,
            "work_weight": cfg.work_weight,
            "drain_reported_queue": cfg.drain_reported_queue,
            "busy_valve": cfg.busy_valve,
            "busy_queue_ms": cfg.busy_queue_ms,
            "busy_backoff_s": cfg.busy_backoff_s,
            "gossip": {
                "delta_interval_s": cfg.gossip.delta_interval_s,
                "full_interval_s": cfg.gossip.full_interval_s,
                "load_interval_s": cfg.gossip.load_interval_s,
                "keepalive_interval_s": cfg.gossip.keepalive_interval_s,
                "peer_ttl_s": cfg.gossip.peer_ttl_s,
                "instant": cfg.instant_gossip,
                "topic_size": cfg.topic_size or None,
            "discovery": cfg.discovery,
            },
            "churn_interval_s": cfg.churn_interval_s or None,
            "shared_cores": cfg.shared_cores or "none: one machine per node",
            "arrivals": f"closed loop, {cfg.concurrency} in flight" if cfg.concurrency else "open loop, at their times",
            "slots_per_node": cfg.slots,
            "warmup_share": cfg.warmup,
            "seed": cfg.seed,
        },
        "sim": {"virtual_s": _r(end, 3), "events": sim.events, "wall_s": _r(wall_s, 3)},
    }
    if sim.gossip_on and cfg.hashed_load_topics():
        result["discovery"]["load_topics"] = sim.hashed_topics_summary()
        result["params"]["gossip"]["load_topics"] = "hash"
    if sim.shadow_total:
        result["oracle_agreement"] = _r(sim.shadow_agree / sim.shadow_total, 4)
    return result


def _lookup_summary(sim: FinishedRun) -> dict[str, float] | None:
    """Virtual time from routing to decision: the directory round trip (0 with gossip)."""
    if not sim.dir_on or not sim.lookup_ms:
        return None
    waits = sorted(sim.lookup_ms)
    return {"mean": _r(statistics.fmean(waits)), "p50": _r(percentile(waits, 50)), "p99": _r(percentile(waits, 99))}


def _discovery(sim: FinishedRun, node_seconds: float, node_rates: list[float], busiest: Any) -> dict[str, Any]:
    """Inbound discovery bytes per node per second, by kind; the busiest node too."""
    cfg = sim.config
    by_kind = {"gossip " + k: _r(sim.msg_bytes_in[k] / node_seconds, 1) for k in sorted(sim.msg_bytes_in)}
    for k in sorted(sim.dir_bytes):
        by_kind["directory " + k] = _r(sim.dir_bytes[k] / node_seconds, 1)
    out: dict[str, Any] = {
        "mode": cfg.discovery,
        "in_bytes_per_node_per_s_by_kind": by_kind,
        "in_bytes_per_s_node_p50": _r(percentile(node_rates, 50), 1),
        "in_bytes_per_s_node_p99": _r(percentile(node_rates, 99), 1),
        "in_bytes_per_s_node_max": _r(node_rates[-1], 1) if node_rates else 0.0,
    }
    if sim.dir_on:
        d = cfg.directory
        life = max(1e-9, (busiest.left_at if busiest.left_at is not None else sim.now) - busiest.joined_at)
        out["busiest_node_in_bytes_per_s_by_kind"] = {k: _r(v / life, 1) for k, v in sorted(busiest.bytes_by_kind.items())}
        out["busiest_node_anchors_owned"] = sum(
            1 for a in sim.membership.keys() if busiest.id in sim.membership.owners(a)
        )
        out["directory"] = {
            "config": {
                "anchor_blocks": d.anchor_blocks,
                "replicas": d.replicas,
                "answer_holders": d.answer_holders,
                "update_interval_s": d.update_interval_s,
                "refresh_s": d.refresh_s,
                "refresh": d.refresh,
                "entry_ttl_s": d.entry_ttl_s,
                "query_timeout_s": d.query_timeout_s,
                "query_attempts": d.query_attempts,
                "query_stride": d.query_stride,
                "query_tail": d.query_tail,
                "membership_delay_s": cfg.membership_delay_s,
            },
            "messages": dict(sorted(sim.dir_count.items())),
            "lost": sim.dir_lost,
            "query_timeouts": sim.dir_timeouts,
            "decided_without_answer": sim.dir_blind,
            "answers_used": sim.dir_answered,
            "answers_empty": sim.dir_empty,
            "anchors_placed": sim.membership.placed(),
            "dht": {
                "lookups": dict(sorted(sim.dht_lookups.items())),
                "find_node_requests": sim.dht_find_nodes,
                "counted": "KadDHT routing-table refreshes and per-anchor lookups (p2pinfer/core/dht.py): one round of "
                "FIND_NODE per lookup, every member in every table; connections a lookup opens are not counted",
            }
            if sim.dht_on
            else None,
            "counted": "inbound bytes per node: direct libp2p streams (yamux + noise frames, multistream-select, "
            "FIN), no fan-out; topic gossip as for gossip discovery",
        }
    return out
