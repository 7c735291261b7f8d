"""Plain counters of what a node did, for /status and Prometheus.

Kept as integers in a dataclass rather than prometheus-client objects so
that several nodes can live in one process (tests, benchmarks) without
sharing a registry; the HTTP layer exports them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

__all__ = ["NodeCounters"]


@dataclass
class NodeCounters:
    requests: int = 0
    """Requests that entered at this node."""
    requests_failed: int = 0
    served_local: int = 0
    """Requests that entered here and were served here."""
    served_remote: int = 0
    """Requests that entered here and were served by a peer."""
    forwards_served: int = 0
    """Requests forwarded to this node that it completed."""
    forwards_refused: Counter[str] = field(default_factory=Counter)
    """Refusals this node sent, by error code."""
    refusals_received: Counter[str] = field(default_factory=Counter)
    """Refusals peers sent to this node, by error code."""
    fallbacks: int = 0
    """Requests that moved on to the next candidate (refusal or failure)."""
    resumed: int = 0
    """Attempts that continued a generation a dead target had started."""
    forward_failures: int = 0
    """Forwards lost to a transport failure (dead peer, reset stream, stall)."""
    frames_rejected: int = 0
    streams_refused: int = 0
    """Generate streams refused because their peer had ``max_streams_per_peer`` open."""
    pubsub_relayed_refused: int = 0
    """Pubsub streams not opened because the peer was reachable only through a relay (``CountingPubsub``)."""
    peers_distrusted: int = 0
    """Sanctions this node imposed on peers (a cache that was not there, or wrong tokens)."""
    answers_checked: Counter[str] = field(default_factory=Counter)
    """Forwarded answers this node checked against its own model
    (:mod:`p2pinfer.core.verify`), by result: ``passed``, ``rejected`` (held
    back, never shown, continued elsewhere), ``failed_after_streaming`` (a
    spot check of an answer the client already had), ``error`` (the check
    itself could not run: the answer is passed on unchecked)."""
    tokens_checked: int = 0
    """Prompt and answer tokens this node's engine prefilled to check answers."""
    check_seconds: float = 0.0
    """Time its engine spent on those checks (queue included)."""
    checks_delegated: Counter[str] = field(default_factory=Counter)
    """Spot checks this node asked a third peer holding the prompt's prefix to
    score (``/p2pinfer/check/1.0.0``), by outcome: ``passed``, ``failed``
    (the verdict failed and this node's own check confirmed it),
    ``verifier_wrong`` (this node's own check passed what the verifier's
    scores failed, or its answer was malformed: the verifier is distrusted),
    ``fallback`` (refused, unreachable or too slow: checked here instead)."""
    checks_served: int = 0
    """Check requests of peers this node scored."""
    check_tokens_served: int = 0
    """Tokens its engine evaluated for them (prompt not restored from its cache, and the answers)."""
    checks_refused: Counter[str] = field(default_factory=Counter)
    """Check requests it refused, by error code."""
    gossip_published: int = 0
    gossip_published_bytes: int = 0
    gossip_received: int = 0
    gossip_received_bytes: int = 0
    """Signed pubsub messages as they travel (data, topic, ids, signature)."""
    gossip_rejected: Counter[str] = field(default_factory=Counter)
    digests_not_gossiped: int = 0
    """Own digests too big for one gossip message (peers pull them instead)."""
    digests_applied: int = 0
    digest_gaps: int = 0
    pulls_done: int = 0
    pulls_failed: int = 0
    pulls_served: int = 0
    peers_expired: int = 0
    """Peers that left the view after ``peer_ttl_s`` of silence."""
    peers_disconnected: int = 0
    """Peers that left the view because their connection to this node closed."""
    dials_ok: int = 0
    dials_failed: int = 0
    rtt_probes: int = 0
    """libp2p pings sent to measure round-trip times."""
    pubsub_rpcs_sent: Counter[str] = field(default_factory=Counter)
    """Pubsub RPCs this node wrote, by what they carry (``publish load``,
    ``publish digest``, ``publish model`` (an announcement on /p2pinfer/models/1), ``ihave``, ``iwant``, ``graft``, ``prune``, ``idontwant``,
    ``subscriptions``; an RPC carrying several kinds counts once for each):
    relayed copies and gossipsub control traffic included."""
    pubsub_bytes_sent: Counter[str] = field(default_factory=Counter)
    """Bytes of those RPCs (protobuf, before yamux and Noise framing), by the RPC's first kind."""
    served_by_path: Counter[str] = field(default_factory=Counter)
    """Requests that entered here and were served by a peer, by path (direct, hole-punched, relayed)."""
    reachability_checks: Counter[str] = field(default_factory=Counter)
    """Dial-back requests this node made, by result (public, private, untrusted, none)."""
    reachability_untrusted: int = 0
    """Dial-backs a server claimed without proof over a fresh connection (the AutoNAT v1 flaw)."""
    dialbacks_served: int = 0

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in self.__dict__.items():
            out[key] = dict(value) if isinstance(value, Counter) else value
        return out
