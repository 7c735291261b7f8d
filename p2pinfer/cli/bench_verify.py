"""``p2pinfer bench verify``: the greedy tolerance and sampling threshold of answer checks, measured.

The command only; what it runs is in p2pinfer/lab/verify_bench.py.
"""

from __future__ import annotations

import json

import typer


def register(app: typer.Typer, bench: typer.Typer) -> None:
    @bench.command("verify")
    def verify(
        prompts: int = typer.Option(20, min=1, help="MMLU five-shot prompts."),
        max_tokens: int = typer.Option(16, min=1, max=256, help="Tokens per answer."),
        temperature: float = typer.Option(0.8, min=0.05, max=5.0, help="Temperature of the sampled answers."),
        seed: int = typer.Option(1),
        subjects: int = typer.Option(0, min=0, help="MMLU subjects with the shortest headers (0: all)."),
        cache_tokens: int = typer.Option(16384, min=0, help="Prefix cache of each engine, in tokens (0: every check cold)."),
        as_json: bool = typer.Option(False, "--json"),
    ) -> None:
        """Honest answers across CPU configurations against another model's and random tokens: the gaps a check sees."""
        from ..provenance import with_provenance
        from ..lab.verify_bench import run_verify_tolerance

        result = with_provenance(run_verify_tolerance(prompts, max_tokens, seed, temperature, subjects, cache_tokens))
        if as_json:
            typer.echo(json.dumps(result))
        else:
            from rich.console import Console
            from rich.pretty import Pretty

            Console().print(Pretty(result))
