"""``p2pinfer bench api``: the cost of delegation, grammars and logprobs on a live two-model swarm.

The command only; what it runs is in p2pinfer/lab/api_bench.py.
"""

from __future__ import annotations

import json

import typer


def register_lab(lab: typer.Typer) -> None:
    @lab.command("reply-render")
    def reply_render_cmd(
        max_tokens: int = typer.Option(160, min=1, max=1024, help="Tokens per reply (greedy)."),
        model: str = typer.Option("", "--model", help="GGUF file (default: SmolLM2-135M-Instruct)."),
        completion: bool = typer.Option(False, "--completion", help="Plain completions continued by the client, not chats."),
        reply_cache: bool = typer.Option(True, "--reply-cache/--no-reply-cache", help="The engine caches replies."),
    ) -> None:
        """Where the next turn's rendered prompt stops matching prompt + generated tokens, and what the
        engine's cache holds of it (JSON)."""
        from ..engines.llama_cpp import LlamaCppEngine
        from ..provenance import with_provenance
        from ..lab.reply_render import reply_alignment

        options = {"threads": 1, "cache_tokens": 8192, "slots": 1, "context_size": 2048, "reply_cache": reply_cache,
                   **({"model_path": model} if model else {})}
        engine = LlamaCppEngine.create(**options)
        typer.echo(json.dumps(with_provenance(reply_alignment(engine, max_tokens, completion=completion)), indent=2))


def register(app: typer.Typer, bench: typer.Typer) -> None:
    @bench.command("api")
    def api_cmd(
        reps: int = typer.Option(5, min=1, max=50, help="Runs of each measurement (figures are medians with min and max)."),
        threads: int = typer.Option(1, min=1, help="llama.cpp threads per node."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ) -> None:
        """SmolLM2 and Gemma 3 nodes: delegated against direct TTFT, decode with a JSON-schema grammar and with logprobs."""
        from ..lab.api_bench import run_api_bench
        from ..provenance import with_provenance

        result = with_provenance(run_api_bench(reps=reps, threads=threads))
        if as_json:
            typer.echo(json.dumps(result, indent=2))
            return
        r = result["ratios_of_medians"]
        typer.echo(f"TTFT direct {result['direct']['ttft_ms']['median']:.1f} ms, delegated "
                   f"{result['delegated']['ttft_ms']['median']:.1f} ms ({r['delegated_over_direct_ttft']:.2f}x)")
        typer.echo(f"decode ms/token plain {result['plain_chat']['decode_ms_per_token']['median']:.2f}, json_schema "
                   f"{result['json_schema_chat']['decode_ms_per_token']['median']:.2f} ({r['json_schema_over_plain_decode']:.2f}x), "
                   f"logprobs {result['logprobs_chat']['decode_ms_per_token']['median']:.2f} ({r['logprobs_over_plain_decode']:.2f}x)")
