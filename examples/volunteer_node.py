#!/usr/bin/env python3
"""Join a p2pinfer swarm with this machine's CPU or GPU.

Run it on any machine that can reach one node of the swarm:

    pip install "p2pinfer[llama,model]"
    python volunteer_node.py --bootstrap /ip4/198.51.100.4/tcp/4001/p2p/12D3KooW...

It loads the model (SmolLM2-135M-Instruct by default, or --model PATH),
keeps a persistent identity in ~/.p2pinfer/volunteer.key, joins the swarm,
serves requests forwarded to it, and exposes the OpenAI-compatible API on
--http-port for local clients. Ctrl-C leaves the swarm cleanly.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
import signal

import trio

import p2pinfer
from p2pinfer.api import serve_http


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bootstrap", action="append", default=[], help="multiaddr with /p2p/<id> (repeatable)")
    p.add_argument("--listen", default="/ip4/0.0.0.0/tcp/4001")
    p.add_argument("--announce", action="append", default=[], help="public address, if behind NAT")
    p.add_argument("--engine", default="llama-cpp", help="llama-cpp (default) or simulated")
    p.add_argument("--model", help="GGUF file (default: SmolLM2-135M-Instruct)")
    p.add_argument("--cache-tokens", type=int, help="prefix-cache budget in tokens")
    p.add_argument("--http-port", type=int, default=8000, help="OpenAI API port (0 = any)")
    p.add_argument("--key-file", default="~/.p2pinfer/volunteer.key")
    p.add_argument("--swarm-secret", "--secret", dest="secret", help="swarm secret, if the swarm is private")
    p.add_argument("--ready-file", help="write peer id and addresses as JSON here once serving")
    p.add_argument("--cpu-repack", action="store_true", help="let llama.cpp repack weights for this CPU (crashes on some Intel AMX CPUs)")
    return p.parse_args()


def engine_works_here(options: dict[str, object]) -> bool:
    """A short test generation in a child process: a crash there is a message here, not a dead node."""
    from p2pinfer.engines.engine_check import EngineCheck, check_engine

    result = check_engine(EngineCheck("this node's", options))
    if not result.ok:
        print(f"error: {result.error}. Run `p2pinfer doctor` to see which configuration works on this machine.")
    return result.ok


async def main(args: argparse.Namespace) -> None:
    options: dict[str, object] = {}
    if args.model:
        options["model_path"] = args.model
    if args.cache_tokens:
        options["cache_tokens"] = args.cache_tokens
    if args.cpu_repack:
        options["cpu_repack"] = True
    if args.engine == "llama-cpp" and not engine_works_here(options):
        raise SystemExit(3)
    key_file = Path(args.key_file).expanduser()
    key_file.parent.mkdir(parents=True, exist_ok=True)
    config = p2pinfer.NodeConfig(
        listen=(args.listen,),
        announce=tuple(args.announce),
        bootstrap=tuple(args.bootstrap),
        key_file=str(key_file),
        engine=args.engine,
        engine_options=options,
        swarm_secret=args.secret.encode() if args.secret else None,
        private_network=bool(args.secret),
    )
    async with p2pinfer.Node(config) as node, trio.open_nursery() as nursery:
        host, port = await nursery.start(serve_http, node, "127.0.0.1", args.http_port)
        print(f"volunteer node {node.peer_id}")
        for addr in node.addrs:
            print(f"  reachable at {addr}")
        print(f"  OpenAI API at http://{host}:{port}/v1")
        if args.ready_file:
            import json

            Path(args.ready_file).write_text(json.dumps({"peer_id": node.peer_id, "http": f"http://{host}:{port}"}))
        nursery.start_soon(heartbeat, node)
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                break  # leave the swarm cleanly: the node closes its streams and host
        nursery.cancel_scope.cancel()
    print("left the swarm")


async def heartbeat(node: p2pinfer.Node) -> None:
    """A status line now and then, so the operator sees the swarm."""
    while True:
        await trio.sleep(30)
        status = node.status()
        print(f"  {len(status['connected_peers'])} peers, {status['engine']['cached_tokens']} cached tokens, "
              f"{status['counters']['forwards_served']} forwarded requests served")


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    trio.run(main, parse_args())
