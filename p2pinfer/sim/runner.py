"""From a workload description to a finished run: the glue the CLI and the
experiments share, so that every policy sees the very same seeded requests."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
import functools
import json
from pathlib import Path
import random
import statistics
from typing import Any

from ..core.costmodel import EngineCostModel
from ..workloads import (
    ConversationWorkload,
    MMLUWorkload,
    PromptEncoder,
    TimedRequest,
    load_mmlu,
    load_tokenizer,
    parse_popularity,
    poisson_arrivals,
    read_trace,
    timed,
)
from .model import SimConfig
from .simulator import Simulator

__all__ = ["DEFAULT_RATE_PER_NODE", "WorkloadSpec", "build_requests", "cost_model_from_bench", "simulate"]

DEFAULT_RATE_PER_NODE = 0.35
"""Arrivals per second per node for synthetic workloads (see docs/results.md)."""


@dataclass(frozen=True)
class WorkloadSpec:
    kind: str = "mmlu"
    """mmlu, conversations or trace."""
    requests: int = 3000
    rate: float | None = None
    """Arrivals per second for the whole swarm; default DEFAULT_RATE_PER_NODE x nodes."""
    popularity: str = "uniform"
    """Subject popularity (mmlu): uniform, zipf:S or hot:SHARE."""
    mmlu_dir: str | None = None
    trace: str | None = None
    tokenizer: str = "auto"
    conversations: int = 64
    """Conversations in flight (conversations workload)."""

    def total_rate(self, nodes: int) -> float:
        return self.rate if self.rate is not None else DEFAULT_RATE_PER_NODE * nodes


@functools.lru_cache(maxsize=4)
def _subjects(mmlu_dir: str | None) -> tuple[Any, ...]:
    return tuple(load_mmlu(mmlu_dir))


@functools.lru_cache(maxsize=2)
def _encoder(kind: str) -> PromptEncoder:
    return PromptEncoder(load_tokenizer(kind))  # type: ignore[arg-type]


def build_requests(spec: WorkloadSpec, nodes: int, seed: int) -> tuple[list[TimedRequest], PromptEncoder, dict[str, Any]]:
    """The seeded request list, the encoder to tokenise it, and its description."""
    encoder = _encoder(spec.tokenizer)
    rng = random.Random(f"{seed}-workload")
    info: dict[str, Any] = {"kind": spec.kind}
    if spec.kind == "trace":
        if not spec.trace:
            raise ValueError("the trace workload needs a trace file")
        header, reqs = read_trace(spec.trace)
        reqs = reqs[: spec.requests] if spec.requests else reqs
        info.update(trace=spec.trace, trace_header=header, requests=len(reqs))
        span = reqs[-1].t - reqs[0].t
        info["rate_per_s"] = round(len(reqs) / span, 4) if span > 0 else None
        return reqs, encoder, info
    rate = spec.total_rate(nodes)
    times = poisson_arrivals(spec.requests, rate, random.Random(f"{seed}-arrivals"))
    subjects = list(_subjects(spec.mmlu_dir))
    if spec.kind == "mmlu":
        wl = MMLUWorkload(subjects, parse_popularity(spec.popularity), seed=seed)
        prompts = wl.prompts(spec.requests, rng)
        header_tokens = [len(encoder.part(wl.header(i), first=True)) for i in range(len(subjects))]
        info.update(
            popularity=wl.popularity.describe(),
            subjects=len(subjects),
            test_questions=sum(len(s.test) for s in subjects),
            header_tokens_total=sum(header_tokens),
            header_tokens_mean=round(sum(header_tokens) / len(header_tokens), 1),
            hottest_subject=wl.ranked[0],
            hottest_share=round(max(wl.weights), 4),
            output_tokens=wl.output_tokens,
        )
    elif spec.kind == "conversations":
        cw = ConversationWorkload(subjects, active=spec.conversations, seed=seed)
        prompts = cw.prompts(spec.requests, rng)
        info.update(conversations_in_flight=spec.conversations, turns=list(cw.turns), output_tokens=cw.reply_tokens)
    else:
        raise ValueError(f"unknown workload {spec.kind!r}: mmlu, conversations or trace")
    info.update(rate_per_s=round(rate, 4), rate_per_node_per_s=round(rate / nodes, 4), arrivals="Poisson")
    return timed(prompts, times), encoder, info


def simulate(
    config: SimConfig,
    spec: WorkloadSpec,
    *,
    progress: Callable[[int, int], None] | None = None,
    requests: tuple[list[TimedRequest], PromptEncoder, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Run one simulation; pass ``requests`` to reuse an already built workload."""
    reqs, encoder, info = requests or build_requests(spec, config.nodes, config.seed)
    return Simulator(config, reqs, encoder, workload=info, progress=progress).run()


def cost_model_from_bench(*paths: str | Path) -> EngineCostModel:
    """An engine cost model from the JSON that ``p2pinfer bench engine --json``
    prints; with several files (runs of one machine), the median of each figure."""
    if not paths:
        raise ValueError("no 'p2pinfer bench engine --json' file given")
    runs: list[dict[str, float]] = []
    engines: set[str] = set()
    for path in paths:
        try:
            data = json.loads(Path(path).read_text())
            run = {"prefill": float(data["prefill_ms_per_token"]), "decode": float(data["decode_ms_per_token"])}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: not the JSON of 'p2pinfer bench engine --json' ({exc})") from None
        if not (run["prefill"] > 0 and run["decode"] >= 0):
            raise ValueError(f"{path}: prefill_ms_per_token must be > 0 and decode_ms_per_token >= 0")
        for key, name in (("restore_ms", "restore"), ("request_overhead_ms", "overhead")):
            if isinstance(data.get(key), (int, float)) and data[key] >= 0:
                run[name] = float(data[key])
        engine = data.get("engine")
        engines.add(engine if isinstance(engine, str) else json.dumps(engine)[:120])
        runs.append(run)

    def median_of(name: str, default: float) -> float:
        values = [r[name] for r in runs if name in r]
        return round(statistics.median(values), 4) if values else default

    base = EngineCostModel()
    names = ", ".join(Path(p).name for p in paths)
    return EngineCostModel(
        prefill_ms_per_token=median_of("prefill", base.prefill_ms_per_token),
        decode_ms_per_token=median_of("decode", base.decode_ms_per_token),
        cache_hit_overhead_ms=median_of("restore", base.cache_hit_overhead_ms),
        request_overhead_ms=median_of("overhead", base.request_overhead_ms),
        source=f"p2pinfer bench engine ({'; '.join(sorted(engines))}), "
        + (f"median of {len(paths)} runs: {names}" if len(paths) > 1 else names),
    )
