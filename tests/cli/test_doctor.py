"""``p2pinfer doctor`` reports the machine and survives an engine that crashes (issue 13)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.model


def _doctor(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict]:
    proc = subprocess.run(
        [sys.executable, "-m", "p2pinfer", "doctor", "--json", *args],
        capture_output=True, text=True, env=env, timeout=300,
    )
    return proc.returncode, json.loads(proc.stdout)


def test_doctor_json_has_the_fields_a_bug_report_needs() -> None:
    rc, report = _doctor("--threads", "1")
    assert rc == 0 and report["ok"] is True, report["hints"]
    assert isinstance(report["cpu"]["features"], list) and report["cpu"]["logical_cores"] >= 1
    llama = report["llama_cpp"]
    assert "CPU :" in llama["system_info"] and isinstance(llama["gpu_offload"], bool)
    assert any(d["type"] == "CPU" for d in llama["devices"])
    assert llama["layers"]["model_layers"] > 0 and llama["layers"]["summary"]
    model = report["model"]
    assert model["default"] and len(model["file_identity"]) == 32 and model["fingerprint"]
    assert report["cache"]["capacity_tokens"] > 0 and report["cache"]["kv_bytes_per_token"] > 0
    assert report["libp2p"]["version"] and report["libp2p"]["transports"] == ["tcp"]
    (check,) = report["engine_checks"]
    assert check["config"] == "default" and check["ok"] is True and check["signal"] is None
    assert check["report"]["generated_tokens"] > 0
    assert check["report"]["engine"]["cpu_repack"] is False


def test_doctor_reports_a_crashing_configuration_without_dying() -> None:
    env = dict(os.environ, P2PINFER_TEST_ENGINE_CHECK_SIGNAL="SIGSEGV", P2PINFER_TEST_ENGINE_CHECK_LABELS="cpu-repack")
    rc, report = _doctor("--cpu-repack", "--threads", "1", env=env)
    assert rc == 1 and report["ok"] is False
    by = {c["config"]: c for c in report["engine_checks"]}
    assert by["default"]["ok"] is True
    crashed = by["cpu-repack"]
    assert crashed["ok"] is False and crashed["signal"] == "SIGSEGV" and crashed["exit_code"] == -11
    assert "crashes on this machine" in crashed["error"]
    assert any("without --cpu-repack" in h for h in report["hints"])
