"""``p2pinfer bench concurrency``: N requests in flight on one node, against llama-server."""

from __future__ import annotations

import json
from typing import Optional

import typer


def register(app: typer.Typer, bench: typer.Typer) -> None:
    @bench.command("concurrency")
    def bench_concurrency(
        levels: str = typer.Option("1,4,8", help="Requests in flight, comma separated."),
        llama_server: Optional[str] = typer.Option(
            None, "--llama-server", help="llama-server binary to measure side by side (see docs/results.md to build one)."
        ),
        model: Optional[str] = typer.Option(None, help="GGUF file (default: SmolLM2-135M-Instruct Q4_1)."),
        threads: int = typer.Option(0, min=0, help="CPU threads for both servers (0: all cores)."),
        slots: int = typer.Option(0, min=0, help="p2pinfer engine slots (0: the engine's default)."),
        server_slots: int = typer.Option(0, min=0, help="llama-server -np (0: the highest level)."),
        reply_cache: bool = typer.Option(
            True, "--reply-cache/--no-reply-cache",
            help="The p2pinfer node saves each reply for the next turn (its default; llama-server has no such step).",
        ),
        flash_attn: str = typer.Option(
            "auto", "--flash-attn",
            help="The p2pinfer node's flash attention (its flash_attn setting: auto, on, off); llama-server runs with its own default, -fa auto.",
        ),
        context: int = typer.Option(4096, min=512, help="Context per request, both servers."),
        prompt_tokens: int = typer.Option(300, min=32, max=3000),
        max_tokens: int = typer.Option(64, min=2, max=1024),
        requests_per_client: int = typer.Option(2, min=1, max=20, help="Requests each client sends one after the other."),
        rounds: int = typer.Option(3, min=1, max=20, help="Repetitions of every level (figures are medians)."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ) -> None:
        """Tokens/s and time to first token with 1, 4, 8 streaming requests in flight; engine vs raw llama.cpp."""
        import sys

        from ..lab.concurrency_bench import run_concurrency_bench
        from ..provenance import with_provenance

        try:
            wanted = [int(x) for x in levels.split(",") if x.strip()]
        except ValueError:
            raise typer.BadParameter("comma-separated integers", param_hint="--levels") from None
        if not wanted or any(not 1 <= n <= 64 for n in wanted):
            raise typer.BadParameter("levels must be in 1..64", param_hint="--levels")
        from .settings import SettingsError, flash_attn_option

        try:
            flash_attn_option(flash_attn)
        except SettingsError:
            raise typer.BadParameter("auto, on or off", param_hint="--flash-attn") from None
        result = run_concurrency_bench(
            levels=wanted, model_path=model, threads=threads or None, slots=slots or None, context_size=context,
            prompt_tokens=prompt_tokens, max_tokens=max_tokens, requests_per_client=requests_per_client,
            rounds=rounds, reply_cache=reply_cache, flash_attn=flash_attn, llama_server=llama_server, llama_server_slots=server_slots or None,
            progress=lambda msg: print(msg, file=sys.stderr, flush=True),
        )
        result = with_provenance(result)
        if as_json:
            typer.echo(json.dumps(result))
            return
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"{result['prompt_tokens_median']}-token prompts, {max_tokens}-token answers, streaming")
        for col in ("in flight", "p2pinfer tokens/s", "TTFT p50 ms", "TTFT p99 ms", "llama-server tokens/s", "TTFT p50 ms", "TTFT p99 ms"):
            table.add_column(col, justify="right")
        server = {lv["concurrency"]: lv for lv in result.get("llama_server", {}).get("levels", [])}
        for lv in result["levels"]:
            other = server.get(lv["concurrency"], {})
            table.add_row(str(lv["concurrency"]), str(lv["tokens_per_s"]), str(lv["ttft_ms_p50"]), str(lv["ttft_ms_p99"]),
                          str(other.get("tokens_per_s", "")), str(other.get("ttft_ms_p50", "")), str(other.get("ttft_ms_p99", "")))
        Console().print(table)
        for name in ("engine", "raw_llama_cpp"):
            row = result[name]
            Console().print(f"{name}: prefill {row['prefill_ms_per_token']} ms/token, decode {row['decode_ms_per_token']} ms/token")
