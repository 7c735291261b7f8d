"""The JSONL trace format: round trip, strict errors, replay."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from p2pinfer.sim import SimConfig, Simulator
from p2pinfer.sim.runner import WorkloadSpec, build_requests
from p2pinfer.workloads import Prompt, PromptEncoder, TimedRequest, TraceError, load_tokenizer, read_trace, write_trace


def test_round_trip(tmp_path: Path) -> None:
    reqs = [
        TimedRequest(0.0, Prompt("a", ("header\n", "question one"), output_tokens=3)),
        TimedRequest(0.5, Prompt("b", tokens=(1, 2, 3, 70000), output_tokens=1), entry=2),
        TimedRequest(0.5, Prompt("", ("only text",))),
    ]
    path = tmp_path / "t.jsonl"
    assert write_trace(path, reqs, tokenizer="approx-v1") == 3
    header, back = read_trace(path)
    assert header["format"] == "p2pinfer-trace" and header["tokenizer"] == "approx-v1"
    assert back == reqs


def test_workload_round_trip_through_a_trace(tmp_path: Path) -> None:
    spec = WorkloadSpec(requests=50)
    reqs, encoder, _ = build_requests(spec, 4, 1)
    path = tmp_path / "mmlu.jsonl"
    write_trace(path, reqs)
    _, back = read_trace(path)
    assert [encoder.encode(r.prompt) for r in back] == [encoder.encode(r.prompt) for r in reqs]
    assert [r.t for r in back] == [r.t for r in reqs]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"t": 1, "text": "x"}\n{"t": 0.5, "text": "y"}', "back in time"),
        ('{"t": 0, "text": "x", "tokens": [1]}', "exactly one"),
        ('{"t": -1, "text": "x"}', "'t'"),
        ('{"t": 0, "tokens": [1, -2]}', "'tokens'"),
        ('{"t": 0, "tokens": []}', "'tokens'"),
        ('{"t": 0, "text": "x", "output_tokens": 0}', "output_tokens"),
        ('{"t": 0, "text": "x", "colour": "red"}', "unknown keys"),
        ('{"t": 0, "text": "x"}\n{"format": "p2pinfer-trace", "version": 1}', "first line"),
        ('{"format": "p2pinfer-trace", "version": 2}\n{"t": 0, "text": "x"}', "version 1"),
        ("not json", "not JSON"),
        ("", "no requests"),
    ],
)
def test_bad_traces_name_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(TraceError, match=message) as err:
        read_trace(path)
    assert str(path) in str(err.value)


def test_replay_honours_entry_nodes(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    lines = [{"t": i * 10.0, "text": ["shared header " * 40, f"question {i}"], "entry": 1, "output_tokens": 2} for i in range(20)]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    _, reqs = read_trace(path)
    sim = Simulator(SimConfig(nodes=3, policy="local", warmup=0.0), reqs, PromptEncoder(load_tokenizer("approx")))
    result = sim.run()
    assert {r.served_by.idx for r in sim.completed if r.served_by} == {1}
    assert result["hit_rate"] > 0.8  # the shared header is reused on node 1
