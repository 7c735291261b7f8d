"""``p2pinfer bench verify``: honest answers pass their checks across CPU configurations, wrong ones fail.

Real llama.cpp engines (four CPU configurations of SmolLM2, Gemma 3 for the
other model's answers): the figures the issue 21 section of docs/results.md
quotes come from this command.
"""

from __future__ import annotations

import json

from typer.testing import CliRunner

from p2pinfer.cli.main import app


def test_bench_verify_counts_every_honest_check_and_catches_random_tokens() -> None:
    result = CliRunner().invoke(
        app, ["bench", "verify", "--prompts", "3", "--subjects", "1", "--max-tokens", "4", "--json"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["subjects"] and len(data["subjects"]) == 1
    # Every prompt: 2 servers x 2 verifiers greedy checks, 1 sampled answer x 2 verifiers.
    assert data["honest_checks"] == 3 * (2 * 2 + 2)
    assert data["false_accusations"] == data["honest_greedy_rejected"] + data["honest_sampled_rejected"]
    assert data["false_accusations"] == 0, data["honest_max_gap_by_pair"]
    assert set(data["wrong_answers"]) == {"other-model", "truncated-3bit", "truncated-2bit", "random"}
    assert data["wrong_answers"]["random"] == 3
    assert data["wrong_greedy_caught"]["random"] == 3
    assert data["honest_max_gap_nats"]["max"] <= data["greedy_tolerance_nats"] < data["wrong_max_gap_nats"]["random"]["min"]
