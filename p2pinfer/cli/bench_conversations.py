"""``p2pinfer bench conversations``: multi-turn chats on a live swarm, with and without reply caching.

The command only; what it runs is in p2pinfer/lab/conversations_bench.py.
"""

from __future__ import annotations

import json

import typer


def register(app: typer.Typer, bench: typer.Typer) -> None:
    @bench.command("conversations")
    def conversations_cmd(
        nodes: int = typer.Option(2, min=2, max=8, help="Node processes (real llama.cpp engines)."),
        conversations: int = typer.Option(3, min=1, max=8, help="Conversations, their turns interleaved."),
        turns: int = typer.Option(3, min=2, max=5, help="Turns per conversation."),
        max_tokens: int = typer.Option(256, min=8, max=1024, help="Reply length cap (greedy)."),
        threads: int = typer.Option(1, min=1, help="llama.cpp threads per node."),
        think_s: float = typer.Option(1.0, min=0.0, max=60.0, help="Seconds between a reply and the next turn."),
        seed: int = typer.Option(1, help="Seeds the entry nodes and the interleaving."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ) -> None:
        """Turns entering at random nodes: the reused share of the previous turn, and TTFT with reply caching and without."""
        from ..lab.conversations_bench import run_conversations_bench
        from ..provenance import with_provenance

        try:
            result = with_provenance(run_conversations_bench(
                nodes=nodes, conversations=conversations, turns=turns, max_tokens=max_tokens, threads=threads,
                think_s=think_s, seed=seed,
            ))
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
        if as_json:
            typer.echo(json.dumps(result, indent=2))
            return
        w, wo, sim = result["with_reply_cache"], result["without_reply_cache"], result["simulator"]
        typer.echo(f"reuse of the previous turn (turns 2+): {w['reuse_of_previous_turn']} with reply caching, "
                   f"{wo['reuse_of_previous_turn']} without (simulator: {sim['with_reply_cache']['reuse_of_previous_turn']})")
        typer.echo(f"mean TTFT turns 2+: {w['ttft_ms_mean']} ms with, {wo['ttft_ms_mean']} ms without "
                   f"(simulator: {sim['with_reply_cache']['ttft_ms_mean']} / {sim['without_reply_cache']['ttft_ms_mean']} ms)")
