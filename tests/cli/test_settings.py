from __future__ import annotations

from pathlib import Path

import pytest

from p2pinfer.cli.settings import SettingsError, resolve_settings


def test_precedence_flag_env_file_default(tmp_path: Path) -> None:
    cfg = tmp_path / "node.toml"
    cfg.write_text('http_port = 7000\npolicy = "paper"\ncache_tokens = 5000\nbootstrap = ["/ip4/1.2.3.4/tcp/1/p2p/x"]\n')
    env = {"P2PINFER_POLICY": "random", "P2PINFER_CACHE_TOKENS": "6000"}
    settings, origin = resolve_settings({"cache_tokens": 7000}, env=env, config_path=str(cfg))
    assert settings.cache_tokens == 7000 and origin["cache_tokens"] == "flag"
    assert settings.policy == "random" and origin["policy"] == "$P2PINFER_POLICY"
    assert settings.http_port == 7000 and origin["http_port"].startswith("config file")
    assert settings.bootstrap == ["/ip4/1.2.3.4/tcp/1/p2p/x"]
    assert settings.engine == "llama-cpp" and origin["engine"] == "default"


def test_env_lists_and_bools() -> None:
    env = {"P2PINFER_BOOTSTRAP": "/a/p2p/x, /b/p2p/y", "P2PINFER_MDNS": "yes"}
    settings, _ = resolve_settings({}, env=env)
    assert settings.bootstrap == ["/a/p2p/x", "/b/p2p/y"] and settings.mdns is True


def test_config_file_from_env_variable(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("http_port = 9001\n")
    settings, _ = resolve_settings({}, env={"P2PINFER_CONFIG": str(cfg)})
    assert settings.http_port == 9001


@pytest.mark.parametrize(
    ("content", "env", "match"),
    [
        ("http_prot = 1\n", {}, "unknown settings http_prot"),
        ("http_port = [\n", {}, "not valid TOML"),
        ("http_port = 'x'\n", {}, "http_port from config file"),
        ("", {"P2PINFER_MDNS": "maybe"}, r"mdns from \$P2PINFER_MDNS"),
    ],
)
def test_bad_settings_name_the_source(tmp_path: Path, content: str, env: dict[str, str], match: str) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(content)
    with pytest.raises(SettingsError, match=match):
        resolve_settings({}, env=env, config_path=str(cfg))


def test_missing_config_file() -> None:
    with pytest.raises(SettingsError, match="does not exist"):
        resolve_settings({}, env={}, config_path="/nonexistent/p2pinfer.toml")


def test_one_name_per_setting_and_the_old_names_say_what_they_became(tmp_path: Path) -> None:
    from p2pinfer.cli.node_cmd import node_config_from_settings
    from p2pinfer.net.config import NodeConfig

    cfg = tmp_path / "node.toml"
    cfg.write_text('swarm_secret = "s"\nprivate_network = true\ncontext_size = 512\nkey_file = ""\n')
    settings, _ = resolve_settings({}, env={}, config_path=str(cfg))
    config = node_config_from_settings(settings)
    assert (config.swarm_secret, config.private_network, config.key_file) == (b"s", True, None)
    assert config.engine == NodeConfig().engine == settings.engine == "llama-cpp"
    assert config.engine_options["context_size"] == 512
    cfg.write_text('secret = "s"\nprivate = true\n')
    with pytest.raises(SettingsError, match="private is now called private_network, secret is now called swarm_secret"):
        resolve_settings({}, env={}, config_path=str(cfg))
    with pytest.raises(SettingsError, match=r"\$P2PINFER_CONTEXT is now called \$P2PINFER_CONTEXT_SIZE"):
        resolve_settings({}, env={"P2PINFER_CONTEXT": "512"})


def test_nat_settings_reach_the_node_config(tmp_path: Path) -> None:
    from p2pinfer.cli.node_cmd import node_config_from_settings

    cfg = tmp_path / "node.toml"
    cfg.write_text('reachability = "private"\nrelay_service = "off"\nrelays = ["/ip4/198.51.100.4/tcp/4001/p2p/R"]\n')
    settings, _ = resolve_settings({"hole_punching": False}, env={}, config_path=str(cfg))
    nat = node_config_from_settings(settings).nat
    assert (nat.reachability, nat.relay_service, nat.relays, nat.hole_punching) == (
        "private", "off", ("/ip4/198.51.100.4/tcp/4001/p2p/R",), False)
    settings, _ = resolve_settings({}, env={"P2PINFER_RELAY_SERVICE": "sometimes"})
    with pytest.raises(SettingsError, match="relay_service must be auto, on or off"):
        node_config_from_settings(settings)


def test_relay_limits_are_node_settings_with_the_nat_config_names_and_defaults(tmp_path: Path) -> None:
    from dataclasses import fields

    from p2pinfer.cli.node_cmd import node_config_from_settings
    from p2pinfer.net.config import NatConfig

    names = [f.name for f in fields(NatConfig) if f.name.startswith("relay_") and f.name != "relay_service"]
    assert len(names) == 7
    defaults = NatConfig()
    settings, _ = resolve_settings({}, env={})
    assert {n: getattr(settings, n) for n in names} == {n: getattr(defaults, n) for n in names}
    cfg = tmp_path / "node.toml"
    cfg.write_text("relay_max_circuits = 32\nrelay_circuit_max_duration_s = 600.5\n")
    settings, origin = resolve_settings(
        {"relay_reservations": 1},
        env={"P2PINFER_RELAY_MAX_RESERVATIONS": "512", "P2PINFER_RELAY_RESERVATION_TTL_S": "120"},
        config_path=str(cfg),
    )
    nat = node_config_from_settings(settings).nat
    assert (nat.relay_reservations, nat.relay_max_reservations, nat.relay_max_circuits) == (1, 512, 32)
    assert (nat.relay_circuit_max_duration_s, nat.relay_reservation_ttl_s) == (600.5, 120.0)
    assert origin["relay_max_reservations"] == "$P2PINFER_RELAY_MAX_RESERVATIONS"
    with pytest.raises(SettingsError, match="relay_circuit_max_duration_s from .*expected a number"):
        resolve_settings({}, env={"P2PINFER_RELAY_CIRCUIT_MAX_DURATION_S": "an hour"})
    settings, _ = resolve_settings({}, env={"P2PINFER_RELAY_RESERVATIONS": "9"})
    with pytest.raises(SettingsError, match="relay_reservations must be in 0..4"):
        node_config_from_settings(settings)
