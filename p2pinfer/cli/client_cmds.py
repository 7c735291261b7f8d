"""``p2pinfer ask`` and ``p2pinfer status``: talk to a running node over HTTP."""

from __future__ import annotations

import json
from typing import Optional

import typer

DEFAULT_URL = "http://127.0.0.1:8000"


def _auth_headers(api_key: str | None) -> dict[str, str]:
    key = (api_key or "").split(",")[0].strip()
    return {"Authorization": f"Bearer {key}"} if key else {}


def _fail(message: str) -> None:
    typer.secho(f"error: {message}", err=True, fg="red")
    raise typer.Exit(1)


def register(app: typer.Typer, bench: typer.Typer) -> None:
    @app.command("ask")
    def ask(
        prompt: str = typer.Argument(..., help="The prompt (a chat message unless --raw)."),
        url: str = typer.Option(DEFAULT_URL, envvar="P2PINFER_URL", help="Any node's HTTP API."),
        max_tokens: int = typer.Option(128, min=1, help="Tokens to generate."),
        temperature: float = typer.Option(0.0, min=0.0, max=2.0),
        raw: bool = typer.Option(False, "--raw", help="Plain completion: no chat template."),
        system: Optional[str] = typer.Option(None, help="System message."),
        as_json: bool = typer.Option(False, "--json", help="Print the final routing facts as JSON."),
        api_key: Optional[str] = typer.Option(None, envvar="P2PINFER_API_KEY", help="The node's API key, if it has one."),
    ) -> None:
        """Send a prompt to a node and stream the answer; says who served it and why."""
        import httpx

        path = "/v1/completions" if raw else "/v1/chat/completions"
        body: dict[str, object] = {"max_tokens": max_tokens, "temperature": temperature, "stream": True}
        if raw:
            body["prompt"] = prompt
        else:
            messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
            body["messages"] = messages
        facts: dict[str, object] = {}
        try:
            with httpx.Client(timeout=httpx.Timeout(10.0, read=600.0), headers=_auth_headers(api_key)) as client:
                with client.stream("POST", url.rstrip("/") + path, json=body) as resp:
                    if resp.status_code != 200:
                        resp.read()
                        try:
                            _fail(f"HTTP {resp.status_code}: {resp.json()['error']['message']}")
                        except (ValueError, KeyError):
                            _fail(f"HTTP {resp.status_code}: {resp.text[:300]}")
                    for line in resp.iter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        event = json.loads(line[6:])
                        if "error" in event:
                            _fail(event["error"]["message"])
                        choice = event["choices"][0]
                        text = choice.get("text") if raw else choice.get("delta", {}).get("content")
                        if text and not as_json:
                            typer.echo(text, nl=False)
                        if "p2pinfer" in event:
                            facts = event["p2pinfer"]
        except httpx.HTTPError as exc:
            _fail(f"cannot reach {url}: {exc}")
        if as_json:
            typer.echo(json.dumps(facts))
            return
        typer.echo()
        if facts:
            typer.secho(
                f"[served by {str(facts['served_by'])[:16]}… hops {facts['hops']}, reused "
                f"{facts['reused_tokens']}/{facts['prompt_tokens']} tokens (predicted {facts['predicted_reused_tokens']}), "
                f"TTFT {facts['ttft_ms']} ms; {facts['reason']}]",
                fg="cyan", err=True,
            )

    @app.command("status")
    def status(
        url: str = typer.Option(DEFAULT_URL, envvar="P2PINFER_URL", help="A node's HTTP API."),
        as_json: bool = typer.Option(False, "--json", help="Print the raw /status JSON."),
        api_key: Optional[str] = typer.Option(None, envvar="P2PINFER_API_KEY", help="The node's API key, if it has one."),
    ) -> None:
        """Show a node, its cache and its view of the peers."""
        import httpx

        try:
            resp = httpx.get(url.rstrip("/") + "/status", timeout=10.0, headers=_auth_headers(api_key))
            if resp.status_code != 200:
                _fail(f"HTTP {resp.status_code} from {url}/status: {resp.text[:300]}")
            data = resp.json()
        except (httpx.HTTPError, ValueError) as exc:
            _fail(f"cannot read {url}/status: {exc}")
            return
        if as_json:
            typer.echo(json.dumps(data, indent=2))
            return
        from rich.console import Console
        from rich.table import Table

        console = Console()
        eng = data["engine"]
        console.print(f"[bold]{data['peer_id']}[/]  policy [cyan]{data['policy']}[/]  up {data['uptime_s']:.0f} s")
        console.print(f"engine {eng.get('engine')} {eng.get('model')}  cached tokens {eng.get('cached_tokens')}  "
                      f"digest v{data['digest']['version']} ({data['digest']['blocks']} blocks)  "
                      f"queued prefill {data['load']['queued_prefill_tokens']} tokens")
        table = Table(title=f"{len(data['peers'])} peers")
        for col in ("peer", "eligible", "blocks", "digest age s", "queued", "rtt ms", "trust"):
            table.add_column(col, justify="right" if col != "peer" else "left")
        for p in data["peers"]:
            age = p.get("digest_age_s")
            table.add_row(
                p["peer_id"][:20] + "…", "yes" if p["eligible"] else ("busy" if p["busy"] else "no"),
                str(p["cached_blocks"]), "-" if age is None else f"{age:.1f}",
                str(p["queued_prefill_tokens"]), "-" if p["rtt_ms"] is None else f"{p['rtt_ms']:.2f}", f"{p['trust']:.2f}",
            )
        console.print(table)
        models = data.get("swarm_models") or []
        if models:
            mtable = Table(title=f"{len(models)} models in the swarm")
            for col in ("model", "fingerprint", "nodes", "here"):
                mtable.add_column(col, justify="right" if col == "nodes" else "left")
            for m in models:
                mtable.add_row(str(m["id"]), str(m["fingerprint"]), str(m["nodes"]), "yes" if m["served_here"] else "")
            console.print(mtable)
