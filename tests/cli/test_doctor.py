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
    libp2p = report["libp2p"]
    assert libp2p["version"] and libp2p["transports"] == ["tcp", "p2p-circuit"]
    assert libp2p["discovery"]["mode"] == "gossip" and libp2p["hole_punching"] == {"dcutr": True}
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


def test_doctor_reports_the_network_stack_the_settings_make(tmp_path) -> None:
    """Transports, relay, hole punching, discovery and mDNS follow the config file and the environment."""
    config = tmp_path / "node.toml"
    config.write_text(
        'listen = ["/ip4/0.0.0.0/tcp/4001", "/ip4/0.0.0.0/tcp/4002/ws", "/ip4/0.0.0.0/udp/4003/quic-v1"]\n'
        'discovery = "auto"\nauto_directory_nodes = 8\nmdns = true\nrelay_service = "on"\n'
        'relay_reservations = 0\nreachability = "public"\n'
    )
    env = dict(os.environ, P2PINFER_HOLE_PUNCHING="false")
    rc, report = _doctor("--no-engine-check", "--config", str(config), env=env)
    assert rc == 0, report["hints"]
    lp = report["libp2p"]
    assert lp["transports"] == ["tcp", "websocket", "quic", "p2p-circuit"]
    assert lp["reachability"] == "public"
    assert lp["relay"] == {"client": False, "reservations": 0, "static_relays": [], "service": "on"}
    assert lp["hole_punching"] == {"dcutr": False}
    disc = lp["discovery"]
    assert disc["mode"] == "auto" and disc["auto_directory_nodes"] == 8 and disc["mdns"] is True
    assert disc["digest_gossip"] is True and disc["prefix_directory"] is True

    config.write_text('discovery = "directory"\n')
    rc, report = _doctor("--no-engine-check", "--config", str(config))
    disc = report["libp2p"]["discovery"]
    assert rc == 0 and disc["mode"] == "directory" and disc["digest_gossip"] is False and disc["mdns"] is False
    assert report["libp2p"]["relay"]["client"] is True and report["libp2p"]["hole_punching"] == {"dcutr": True}


def test_doctor_refuses_settings_the_node_would_refuse() -> None:
    env = dict(os.environ, P2PINFER_RELAY_SERVICE="sometimes")
    proc = subprocess.run([sys.executable, "-m", "p2pinfer", "doctor", "--json", "--no-engine-check"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "relay_service must be auto, on or off" in proc.stderr


def test_without_llama_cpp_the_report_keeps_its_fields_and_says_why(monkeypatch) -> None:
    # A machine where llama-cpp-python is missing (or its library does not load) still gets
    # the fields a bug report reads, with the reason and what to install.
    from p2pinfer import doctor

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # `import llama_cpp` raises ImportError
    info = doctor.llama_cpp_info()
    assert info["installed"] is False and info["system_info"] is None and info["gpu_offload"] is False
    assert "llama_cpp" in info["error"] and "p2pinfer[llama]" in info["hint"]
