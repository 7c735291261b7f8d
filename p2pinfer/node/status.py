"""What a node reports about itself: ``/status``, ``p2pinfer status``."""

from __future__ import annotations

from collections.abc import Callable
import time
from typing import Any

from ..core.router import Router
from ..core.swarm_models import SwarmModels
from ..engines.base import Engine
from ..net.config import NodeConfig
from ..net.counters import NodeCounters
from ..net.forward import ForwardServer
from ..net.other_models import OtherModels
from ..net.sanctions import PeerSanctions

__all__ = ["NodeStatus"]


class NodeStatus:
    """A mixin of :class:`~p2pinfer.node.Node`: its status report."""

    config: NodeConfig
    engine: Engine
    router: Router
    counters: NodeCounters
    forward_server: ForwardServer
    other_models: OtherModels
    sanctions: PeerSanctions
    swarm_models: SwarmModels
    membership: Any
    host: Any
    _libp2p: Any
    peer_id: str
    addrs: list[str]
    topic: str
    started_at: float
    is_busy: Callable[[], bool]
    paths: Any
    _nat_status: Callable[[], dict[str, Any]]

    def status(self) -> dict[str, Any]:
        """Everything an operator (or /status) wants to see, JSON-ready."""
        now = time.monotonic()
        load = self.engine.load()
        peers = []
        for state in self.router.view:
            peers.append(
                {
                    "peer_id": state.peer_id,
                    "eligible": self.router.view.eligible(state, now),
                    "busy": state.backing_off(now),
                    "distrusted": state.is_distrusted(now),
                    "trust": round(state.trust, 3),
                    "rtt_ms": None if state.rtt_ms is None else round(state.rtt_ms, 3),
                    "digest_version": state.version,
                    "digest_age_s": state.digest_age(now),
                    "cached_blocks": len(state.hashes),
                    "queued_prefill_tokens": state.load.queued_prefill_tokens,
                    "prefill_ms_per_token": state.load.prefill_ms_per_token,
                    "speed_measured": state.load.speed_measured,
                    "active_requests": state.load.active_requests,
                    "slots": state.load.slots,
                    "free_slots": state.load.free_slots,
                    "slot_wait_ms": round(state.load.slot_wait_ms, 1),
                    "last_seen_s": round(now - state.last_seen, 3),
                    "connected": state.peer_id in self.membership.connected(),
                    "path": self.paths.path(state.peer_id),
                    "rtt_path": self.membership.rtt_paths.get(state.peer_id),
                    "reachability": self.membership.reachability_of(state.peer_id),
                }
            )
        return {
            "peer_id": self.peer_id,
            "addrs": list(self.addrs),
            "topic": self.topic,
            "model_fingerprint": self.router.fingerprint_hex,
            "engine": {**self.engine.describe(), "failure": self.engine.failure},
            "policy": self.router.policy.name,
            "uptime_s": round(now - self.started_at, 3),
            "load": {
                "queued_prefill_tokens": load.queued_prefill_tokens,
                "prefill_ms_per_token": load.prefill_ms_per_token,
                "speed_measured": load.speed_measured,
                "active_requests": load.active_requests,
                "slots": load.slots,
                "free_slots": load.free_slots,
                "slot_wait_ms": round(load.slot_wait_ms, 1),
                "busy": self.is_busy(),
                "forwards_in_flight": self.forward_server.inflight,
            },
            "digest": {
                "version": self.router.tracker.version,
                "epoch": self.router.tracker.epoch,
                "blocks": len(self.router.tracker),
                "pending": self.router.tracker.pending,
            },
            "connected_peers": sorted(self.membership.connected()),
            "peers": peers,
            "distrusted_peers": self.sanctions.remaining(),
            "verification": self._verification(),
            "gossip_scores": self._gossip_scores(),
            "gossip_mesh_peers": len(self._libp2p.gossipsub.mesh.get(self.topic, ())),
            "other_model_peers": self.other_models.as_dict(),
            "swarm_models": self.swarm_models.as_dict(now),
            "streams_per_peer": dict(self.forward_server.streams),
            **self._nat_status(),
            "counters": self.counters.as_dict(),
            "discovery": self._discovery_status(),
        }

    def _discovery_status(self) -> dict[str, Any]:
        directory = getattr(self, "directory", None)
        out: dict[str, Any] = {
            "mode": self.config.discovery,
            "digests_published": self.gossip.publish_digests(),
            "querying_directory": directory is not None and not self.gossip.publish_digests(),
        }
        if directory is not None:
            out["directory"] = directory.status()
        load_topics = getattr(self, "load_topics", None)
        if load_topics is not None:
            out.update(load_topics.status())
        return out

    def _verification(self) -> dict[str, Any]:
        """How this node checks forwarded answers (:mod:`p2pinfer.core.verify`) and what it found."""
        checks = self.spot_checks
        cfg = checks.config
        return {
            "enabled": cfg.enabled and self.engine.can_score,
            "verify_fraction": cfg.fraction,
            "verify_budget": cfg.budget,
            "verify_delegate": cfg.delegate,
            "spot_checks_drawn": checks.spot_checks_drawn,
            "spot_checks_over_budget": checks.spot_checks_over_budget,
            "spot_check_tokens": checks.spot_tokens,
            "served_tokens": checks.served_tokens,
            "probation_answers": cfg.probation_answers,
            "probation_hold_tokens": cfg.probation_hold_tokens,
            "probation_windows_passed": checks.windows_passed,
            "greedy_tolerance_nats": cfg.greedy_tolerance,
            "sampling_z": cfg.sampling_z,
            "checks": dict(self.counters.answers_checked),
            "tokens_checked": self.counters.tokens_checked,
            "check_seconds": round(self.counters.check_seconds, 3),
            "checks_delegated": dict(self.counters.checks_delegated),
            "checks_served_for_peers": self.counters.checks_served,
            "check_tokens_served_for_peers": self.counters.check_tokens_served,
            "checks_refused": dict(self.counters.checks_refused),
            "peers_past_probation": sum(1 for p in self.router.view if not checks.on_probation(p.peer_id)),
        }

    def _gossip_scores(self) -> dict[str, float]:
        """gossipsub's peer score of each connected peer (0 unless we penalised it)."""
        scorer = self._libp2p.gossipsub.scorer
        out: dict[str, float] = {}
        if scorer is None:
            return out
        for peer in self.host.get_connected_peers():
            try:
                out[peer.to_base58()] = round(scorer.score(peer, [self.topic]), 3)
            except Exception:  # scoring is advisory; never break /status
                continue
        return out
