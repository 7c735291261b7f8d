"""Prometheus metrics of one node (prometheus-client).

Each node gets its own :class:`~prometheus_client.CollectorRegistry` so that
several nodes in one process (tests, ``p2pinfer swarm``) never mix figures.
Request figures are observed as requests finish; peer and gossip figures are
read from the node when ``/metrics`` is scraped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["NodeMetrics"]

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class _SnapshotCollector(Collector):
    """Reads the node's live state at scrape time."""

    def __init__(self, snapshot: Callable[[], Mapping[str, Any]]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        peers = GaugeMetricFamily("p2pinfer_peers", "Peers in this node's view", labels=["state"])
        for state, n in snap.get("peers_by_state", {}).items():
            peers.add_metric([state], n)
        yield peers
        ages = GaugeMetricFamily("p2pinfer_peer_digest_age_seconds", "Age of each peer's digest", labels=["peer"])
        for peer, age in snap.get("digest_ages", {}).items():
            if age is not None:
                ages.add_metric([peer], age)
        yield ages
        yield GaugeMetricFamily("p2pinfer_cached_tokens", "Tokens in the local prefix cache", value=snap.get("cached_tokens", 0))
        yield GaugeMetricFamily("p2pinfer_digest_hashes", "Block hashes in the local digest", value=snap.get("digest_hashes", 0))
        yield GaugeMetricFamily(
            "p2pinfer_queued_prefill_tokens", "Prompt tokens waiting for prefill", value=snap.get("queued_prefill_tokens", 0)
        )
        gossip = CounterMetricFamily("p2pinfer_gossip_bytes", "Gossip bytes", labels=["direction"])
        gossip.add_metric(["sent"], snap.get("gossip_bytes_sent", 0))
        gossip.add_metric(["received"], snap.get("gossip_bytes_received", 0))
        yield gossip
        msgs = CounterMetricFamily("p2pinfer_gossip_rejected", "Gossip messages dropped by validation", labels=["reason"])
        for reason, n in snap.get("gossip_rejected", {}).items():
            msgs.add_metric([reason], n)
        yield msgs
        checks = CounterMetricFamily(
            "p2pinfer_answer_checks", "Forwarded answers checked against this node's model, by result", labels=["result"]
        )
        for result in ("passed", "rejected", "failed_after_streaming", "error"):
            checks.add_metric([result], snap.get("answers_checked", {}).get(result, 0))
        yield checks
        delegated = CounterMetricFamily(
            "p2pinfer_answer_checks_delegated",
            "Spot checks scored by a peer holding the prompt's prefix (/p2pinfer/check/1.0.0), by outcome", labels=["outcome"],
        )
        for outcome in ("passed", "failed", "verifier_wrong", "fallback"):
            delegated.add_metric([outcome], snap.get("checks_delegated", {}).get(outcome, 0))
        yield delegated
        yield CounterMetricFamily(
            "p2pinfer_answer_checks_served", "Check requests of peers this node scored", value=snap.get("checks_served", 0)
        )
        yield CounterMetricFamily(
            "p2pinfer_answer_check_tokens", "Tokens prefilled to check forwarded answers", value=snap.get("tokens_checked", 0)
        )
        yield CounterMetricFamily(
            "p2pinfer_answer_check_seconds", "Engine time spent checking forwarded answers", value=snap.get("check_seconds", 0.0)
        )
        yield CounterMetricFamily(
            "p2pinfer_peers_distrusted", "Sanctions imposed on peers (cache lies and wrong answers)", value=snap.get("peers_distrusted", 0)
        )
        saves = snap.get("reply_saves")  # an engine that saves replies (after their requests ended)
        if saves is not None:
            yield HistogramMetricFamily(
                "p2pinfer_reply_save_seconds",
                "Engine time spent saving each reply for the next turn, after its request ended",
                buckets=saves.cumulative(), sum_value=saves.sum_s,
            )
            yield CounterMetricFamily(
                "p2pinfer_reply_save_errors", "Reply saves that failed (logged; their requests had finished)", value=saves.errors
            )
            yield GaugeMetricFamily(
                "p2pinfer_reply_saves_in_progress", "Replies being saved now (their slots are taken)", value=saves.in_progress
            )
            yield CounterMetricFamily(
                "p2pinfer_reply_saves_dropped",
                "Reply saves given up before they ran because a request needed their slot (those replies are not cached)",
                value=saves.dropped,
            )


class NodeMetrics:
    def __init__(self, snapshot: Callable[[], Mapping[str, Any]]) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "p2pinfer_requests", "Requests that entered at this node, by outcome", ["outcome"], registry=self.registry
        )
        self.routed = Counter(
            "p2pinfer_routed", "Requests that entered here, by where they were served", ["where"], registry=self.registry
        )
        self.ttft = Histogram(
            "p2pinfer_time_to_first_token_seconds", "Time to first token seen by the client", buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self.predicted = Counter(
            "p2pinfer_predicted_reused_tokens", "Prompt tokens the router predicted would be reused", registry=self.registry
        )
        self.realised = Counter(
            "p2pinfer_realised_reused_tokens", "Prompt tokens really reused from a cache", registry=self.registry
        )
        self.prompt_tokens = Counter("p2pinfer_prompt_tokens", "Prompt tokens of finished requests", registry=self.registry)
        self.registry.register(_SnapshotCollector(snapshot))

    def observe(self, *, outcome: str, ttft_s: float | None = None, forwarded: bool | None = None,
                predicted: int = 0, realised: int = 0, prompt_tokens: int = 0) -> None:
        self.requests.labels(outcome).inc()
        if ttft_s is not None:
            self.ttft.observe(ttft_s)
        if forwarded is not None:
            self.routed.labels("forwarded" if forwarded else "local").inc()
        self.predicted.inc(max(0, predicted))
        self.realised.inc(max(0, realised))
        self.prompt_tokens.inc(max(0, prompt_tokens))

    def render(self) -> bytes:
        return generate_latest(self.registry)
