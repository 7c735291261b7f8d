"""The engine cost model shared by the simulated engine and the simulator.

Times in milliseconds. The defaults are calibrated from ``p2pinfer bench
engine`` on SmolLM2-135M-Instruct Q4_1, llama.cpp on 2 CPU cores (see
docs/results.md); pass other figures to model another machine.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EngineCostModel"]


@dataclass(frozen=True, slots=True)
class EngineCostModel:
    prefill_ms_per_token: float = 4.35
    decode_ms_per_token: float = 12.5
    cache_hit_overhead_ms: float = 2.0
    """Fixed cost of restoring a cached prefix (bookkeeping, KV copy)."""
    request_overhead_ms: float = 1.0
    source: str = "SmolLM2-135M Q4_1, llama.cpp, 2 CPU cores (field notes, 2026-11)"

    def prefill_ms(self, prompt_tokens: int, reused_tokens: int) -> float:
        new = max(1, prompt_tokens - reused_tokens)
        hit = self.cache_hit_overhead_ms if reused_tokens else 0.0
        return self.request_overhead_ms + hit + new * self.prefill_ms_per_token

    def decode_ms(self, tokens: int) -> float:
        return max(0, tokens - 1) * self.decode_ms_per_token

    def scaled(self, factor: float) -> EngineCostModel:
        """The same model ``factor`` times faster (0 makes it free)."""
        return EngineCostModel(
            self.prefill_ms_per_token * factor,
            self.decode_ms_per_token * factor,
            self.cache_hit_overhead_ms * factor,
            self.request_overhead_ms * factor,
            f"{self.source}, scaled x{factor:g}",
        )

    def as_dict(self) -> dict[str, float | str]:
        return {
            "prefill_ms_per_token": self.prefill_ms_per_token,
            "decode_ms_per_token": self.decode_ms_per_token,
            "cache_hit_overhead_ms": self.cache_hit_overhead_ms,
            "request_overhead_ms": self.request_overhead_ms,
            "source": self.source,
        }
