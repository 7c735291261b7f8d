"""``p2pinfer simulate``: the JSON the issue asks for."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from p2pinfer.cli.main import app
from p2pinfer.core.costmodel import EngineCostModel
from p2pinfer.sim.runner import cost_model_from_bench
from p2pinfer.sim import SIM_POLICIES

runner = CliRunner()


def test_one_policy_json_has_the_figures() -> None:
    result = runner.invoke(app, ["simulate", "--workload", "mmlu", "--nodes", "4", "--policy", "cost", "--latency-ms", "1", "--requests", "200", "--seed", "1", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    for key in ("policy", "nodes", "requests", "ttft_ms", "hit_rate", "forwarded_share", "gossip_bytes_per_node_per_s", "decision_us_p50", "cost_model"):
        assert key in data
    assert data["policy"] == "cost" and data["nodes"] == 4 and data["requests"] == 200
    assert data["ttft_ms"]["p50"] <= data["ttft_ms"]["p99"] and 0 < data["hit_rate"] < 1
    assert data["gossip_bytes_per_node_per_s"] > 0 and data["decision_us_p50"] > 0
    assert data["cost_model"]["prefill_ms_per_token"] > 0 and data["tokenizer"]["name"]
    assert data["params"]["cache_tokens_per_node"] == 10_000 and data["workload"]["rate_per_s"] == 1.4


def test_all_policies_share_the_workload() -> None:
    result = runner.invoke(app, ["simulate", "--policy", "all", "--requests", "150", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [d["policy"] for d in data] == list(SIM_POLICIES)
    assert len({json.dumps(d["workload"]) for d in data}) == 1
    by = {d["policy"]: d for d in data}
    assert by["local"]["forwarded_share"] == 0 and by["oracle"]["gossip_bytes_per_node_per_s"] is None


def test_table_output_and_bad_input(tmp_path: Path) -> None:
    result = runner.invoke(app, ["simulate", "--requests", "100", "--policy", "random"])
    assert result.exit_code == 0 and "random" in result.output and "cost model" in result.output
    assert runner.invoke(app, ["simulate", "--policy", "nope"]).exit_code != 0
    assert runner.invoke(app, ["simulate", "--latency-ms", "fast"]).exit_code != 0
    assert runner.invoke(app, ["simulate", "--workload", "trace"]).exit_code != 0
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"t": "soon", "text": "x"}\n')
    out = runner.invoke(app, ["simulate", "--workload", "trace", "--trace", str(bad)])
    assert out.exit_code != 0 and "bad.jsonl:1" in out.output


def test_export_trace_then_replay(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    assert runner.invoke(app, ["simulate", "export-trace", str(path), "--requests", "80", "--tokens"]).exit_code == 0
    result = runner.invoke(app, ["simulate", "--workload", "trace", "--trace", str(path), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["requests"] == 80


def test_calibration_from_bench_engine_json(tmp_path: Path) -> None:
    bench = tmp_path / "engine.json"
    bench.write_text(json.dumps({"benchmark": "engine", "engine": "llama-cpp test", "prefill_ms_per_token": 2.0, "decode_ms_per_token": 9.0, "restore_ms": 5.0, "request_overhead_ms": 3.0}))
    result = runner.invoke(app, ["simulate", "--requests", "100", "--calibration", str(bench), "--json"])
    assert result.exit_code == 0, result.output
    cm = json.loads(result.output)["cost_model"]
    assert (cm["prefill_ms_per_token"], cm["decode_ms_per_token"], cm["cache_hit_overhead_ms"], cm["request_overhead_ms"]) == (2.0, 9.0, 5.0, 3.0)
    assert "engine.json" in cm["source"]
    bench.write_text("{}")
    assert runner.invoke(app, ["simulate", "--calibration", str(bench)]).exit_code != 0


def test_calibration_from_several_runs_takes_each_figures_median(tmp_path: Path) -> None:
    files = []
    for i, (prefill, decode, restore) in enumerate([(2.0, 9.0, 5.0), (4.0, 12.0, 1.0), (3.0, 30.0, 2.0)]):
        files += ["--calibration", str(tmp_path / f"run{i}.json")]
        (tmp_path / f"run{i}.json").write_text(json.dumps({"prefill_ms_per_token": prefill, "decode_ms_per_token": decode, "restore_ms": restore}))
    result = runner.invoke(app, ["simulate", "--requests", "100", *files, "--json"])
    assert result.exit_code == 0, result.output
    cm = json.loads(result.output)["cost_model"]
    assert (cm["prefill_ms_per_token"], cm["decode_ms_per_token"], cm["cache_hit_overhead_ms"]) == (3.0, 12.0, 2.0)
    assert "median of 3 runs" in cm["source"]


def test_default_calibration_is_the_median_of_the_saved_engine_runs() -> None:
    """EngineCostModel's defaults say they are the published `bench engine` runs: they are."""
    runs = sorted((Path(__file__).parents[2] / "docs" / "results").glob("issue23-engine-fb669d6-run*.json"))
    assert len(runs) == 3
    measured, default = cost_model_from_bench(*runs), EngineCostModel()
    for field in ("prefill_ms_per_token", "decode_ms_per_token", "cache_hit_overhead_ms", "request_overhead_ms"):
        assert getattr(default, field) == getattr(measured, field), field


def test_experiment_writes_json_and_png(tmp_path: Path) -> None:
    result = runner.invoke(app, ["simulate", "experiment", "hotspot", "--out", str(tmp_path), "--quick", "--requests", "200", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert (tmp_path / "hotspot.json").exists() and (tmp_path / "hotspot.png").stat().st_size > 10_000
    assert {r["valve"] for r in data["runs"]} == {"valve off", "valve 4 s (old default)", "valve 15 s (default)"}


def test_json_says_which_command_and_commit_ran_it() -> None:
    """Issue 23's rule for every published figure: the JSON names its command and commit."""
    import subprocess
    import sys

    from p2pinfer.provenance import git_commit

    args = ["simulate", "--nodes", "2", "--requests", "40", "--seed", "3", "--json"]
    out = subprocess.run([sys.executable, "-m", "p2pinfer", *args], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    data = json.loads(out.stdout)
    assert data["provenance"]["command"] == "p2pinfer " + " ".join(args)
    assert data["provenance"]["commit"] == git_commit()
    assert data["requests"] == 40  # the figures stay where they were, beside it
