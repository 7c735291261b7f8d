"""`p2pinfer bench engine --json`, small: the figures are there and consistent."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from p2pinfer.cli.main import app

pytestmark = pytest.mark.model


def test_bench_engine_json_reports_a_real_cache_hit() -> None:
    result = CliRunner().invoke(
        app,
        ["bench", "engine", "--json", "--reps", "1", "--prefix-tokens", "64", "--suffix-tokens", "8",
         "--decode-tokens", "4", "--context-size", "256", "--cache-mib", "16"],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["benchmark"] == "engine" and data["engine"]["engine"] == "llama-cpp"
    assert data["prompt_tokens"] == 72 and data["reused_tokens"] == 64
    assert data["runs"][0]["cold_reused_tokens"] == 0
    assert data["greedy_identical_all"] is True
    assert 0 < data["warm_ttft_ms"] and 0 < data["cold_ttft_ms"]
    assert data["warm_over_cold"] == round(data["runs"][0]["warm_over_cold"], 4)
    assert data["cache_budget_tokens"] == 16 * 2**20 // data["cache_bytes_per_token"]
    assert data["distinct_prompts_fit"] == data["cache_budget_tokens"] // 72


def test_bench_engine_rejects_prompts_longer_than_the_context() -> None:
    result = CliRunner().invoke(app, ["bench", "engine", "--json", "--context-size", "64", "--prefix-tokens", "60"])
    assert result.exit_code != 0 and "context" in result.output
