"""The engine cost model shared by the simulated engine and the simulator.

Times in milliseconds. The defaults are the medians of three saved runs of
``p2pinfer bench engine --json`` (SmolLM2-135M-Instruct Q4_1, llama.cpp on
2 CPU cores: docs/results/issue23-engine-fb669d6-run*.json; a test checks
that they still are); ``p2pinfer simulate --calibration FILE`` reads
another machine's runs the same way (:func:`p2pinfer.sim.runner.cost_model_from_bench`).

Continuous batching (issue 18): one decode step of ``k`` sequences costs
more than one of a single sequence, but much less than ``k`` of them.
:meth:`EngineCostModel.decode_step_ms` gives that step's time from a
measured batch curve (decode tokens per second against sequences in one
batch), relative to the single-sequence decode so that :meth:`scaled` and
other calibrations keep the curve's shape. Prompts are prefilled in chunks
of :data:`PREFILL_CHUNK_TOKENS` (:func:`chunk_cuts`), as the llama.cpp
engine's slot loop does, one chunk between two decode steps.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BATCH_DECODE_TOKENS_PER_S", "PREFILL_CHUNK_TOKENS", "EngineCostModel", "chunk_cuts"]

PREFILL_CHUNK_TOKENS = 128
"""Prompt tokens per chunk of the llama.cpp engine on the CPU (its default
``batch_size``; 512 with GPU offload): the slot loop evaluates one chunk,
then one decode step for every decoding slot, and so on."""

BATCH_DECODE_TOKENS_PER_S: tuple[tuple[int, float], ...] = ((1, 36.9), (2, 49.8), (4, 55.0), (8, 60.1))
"""``llama-batched-bench`` on the 2-core machine (issue 18): decode tokens
per second, all sequences together, with 1, 2, 4 and 8 sequences in one
batch. Only the ratios to the first entry are used."""


DEFAULT_SOURCE = (
    "median of 3 runs of 'p2pinfer bench engine --json' at fb669d6 (SmolLM2-135M Q4_1, llama.cpp, "
    "2 CPU cores, AMD EPYC; docs/results/issue23-engine-fb669d6-run*.json)"
)
"""Where :class:`EngineCostModel`'s defaults come from. Until 2026-12-07 they
were the field notes' 4.35 / 12.5 / 2.0 / 1.0 ms (an older engine)."""


def chunk_cuts(n: int, size: int = PREFILL_CHUNK_TOKENS) -> list[tuple[int, int]]:
    """``(offset, length)`` chunks for ``n`` prompt tokens: full chunks of
    ``size``, and never a last chunk of one token after others (it moves
    one token from the chunk before). The llama.cpp runtime cuts prompts so
    (:meth:`~p2pinfer.engines.llama_runtime.LlamaRuntime.chunks`: a
    one-token batch takes other kernels) and the simulator charges the same
    chunks."""
    out = [(off, min(size, n - off)) for off in range(0, n, size)]
    if len(out) > 1 and out[-1][1] == 1:
        (o1, n1), (o2, _) = out[-2], out[-1]
        out[-2:] = [(o1, n1 - 1), (o2 - 1, 2)]
    return out


def _step_ratios(curve: tuple[tuple[int, float], ...]) -> tuple[tuple[int, float], ...]:
    """One step of ``k`` sequences, in single-sequence steps: ``k x tps(1) / tps(k)``."""
    base = dict(curve)[1]
    return tuple((k, k * base / tps) for k, tps in sorted(curve))


@dataclass(frozen=True, slots=True)
class EngineCostModel:
    prefill_ms_per_token: float = 3.43
    decode_ms_per_token: float = 11.466
    """One decode step of one sequence (what a lone answer takes per token)."""
    cache_hit_overhead_ms: float = 6.46
    """Fixed cost of restoring a cached prefix (bookkeeping, KV copy): ``restore_ms``."""
    request_overhead_ms: float = 2.036
    source: str = DEFAULT_SOURCE
    batch_decode_tokens_per_s: tuple[tuple[int, float], ...] = BATCH_DECODE_TOKENS_PER_S
    """Decode throughput against sequences per batch (must include 1); see :meth:`decode_step_ms`."""

    def __post_init__(self) -> None:
        ks = [k for k, _ in self.batch_decode_tokens_per_s]
        if 1 not in ks or len(set(ks)) != len(ks) or any(k < 1 for k in ks):
            raise ValueError("the batch curve needs distinct sequence counts >= 1, 1 among them")
        if any(tps <= 0 for _, tps in self.batch_decode_tokens_per_s):
            raise ValueError("the batch curve's throughputs must be > 0")

    def prefill_ms(self, prompt_tokens: int, reused_tokens: int) -> float:
        new = max(1, prompt_tokens - reused_tokens)
        hit = self.cache_hit_overhead_ms if reused_tokens else 0.0
        return self.request_overhead_ms + hit + new * self.prefill_ms_per_token

    def decode_ms(self, tokens: int) -> float:
        return max(0, tokens - 1) * self.decode_ms_per_token

    def decode_step_ms(self, sequences: int) -> float:
        """One batched decode step carrying one token for each of ``sequences``.

        From the batch curve: a step of ``k`` sequences costs ``k / tps(k)``
        seconds where one sequence's costs ``1 / tps(1)``, so the step is
        ``k x tps(1) / tps(k)`` single-sequence steps (1.48 at 2, 2.68 at 4,
        4.91 at 8 with the default curve), linear between measured points;
        past the largest, each sequence costs what it did there (the
        throughput stays flat, a conservative guess). 0 sequences cost 0.
        """
        if sequences <= 0:
            return 0.0
        ratios = _step_ratios(self.batch_decode_tokens_per_s)
        last_k, last_r = ratios[-1]
        if sequences >= last_k:
            return self.decode_ms_per_token * last_r * sequences / last_k
        for (k0, r0), (k1, r1) in zip(ratios, ratios[1:]):
            if k0 <= sequences <= k1:
                return self.decode_ms_per_token * (r0 + (r1 - r0) * (sequences - k0) / (k1 - k0))
        return self.decode_ms_per_token * ratios[0][1]  # below the first point: 1 sequence

    def scaled(self, factor: float) -> EngineCostModel:
        """The same model ``factor`` times faster (0 makes it free; 1 is this model, its source unchanged)."""
        if factor == 1.0:
            return self
        return EngineCostModel(
            self.prefill_ms_per_token * factor,
            self.decode_ms_per_token * factor,
            self.cache_hit_overhead_ms * factor,
            self.request_overhead_ms * factor,
            f"{self.source}, scaled x{factor:g}",
            self.batch_decode_tokens_per_s,
        )

    def as_dict(self) -> dict[str, float | str | list[list[float]]]:
        return {
            "prefill_ms_per_token": self.prefill_ms_per_token,
            "decode_ms_per_token": self.decode_ms_per_token,
            "cache_hit_overhead_ms": self.cache_hit_overhead_ms,
            "request_overhead_ms": self.request_overhead_ms,
            "source": self.source,
            "batch_decode_tokens_per_s": [[k, tps] for k, tps in self.batch_decode_tokens_per_s],
        }
