#!/usr/bin/env python3
"""Embed p2pinfer in an ordinary (non-trio) application.

A small "study helper" that answers MMLU-style questions through the swarm.
`SyncNode` runs the node on a background thread, so the application code
stays plain synchronous Python. Every answer says where it was served and
how much of its prompt came from a KV cache.

    python embed_in_app.py                       # a node of its own, default model
    python embed_in_app.py --bootstrap /ip4/.../p2p/12D3KooW...   # join a swarm
"""

from __future__ import annotations

import argparse

import p2pinfer

SYSTEM = "You are a concise tutor. Answer with one short sentence."
QUESTIONS = [
    "What is the derivative of x squared?",
    "What is the capital of Australia?",
    "What does a radix tree store?",
]


def main() -> None:
    p = argparse.ArgumentParser(description="Ask a few questions through a p2pinfer node.")
    p.add_argument("--bootstrap", action="append", default=[])
    p.add_argument("--engine", default="llama-cpp")
    p.add_argument("--max-tokens", type=int, default=24)
    args = p.parse_args()

    config = p2pinfer.NodeConfig(
        listen=("/ip4/127.0.0.1/tcp/0",), bootstrap=tuple(args.bootstrap), engine=args.engine
    )
    with p2pinfer.SyncNode(config) as node:
        for question in QUESTIONS:
            messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
            result = node.complete(messages, max_tokens=args.max_tokens, temperature=0.0)
            where = "here" if result.served_locally else f"peer {result.served_by[:16]}"
            print(f"Q: {question}\nA: {result.text.strip()}")
            print(f"   (served {where}; {result.reused_tokens}/{result.prompt_tokens} prompt tokens reused, "
                  f"TTFT {result.ttft_s * 1000:.0f} ms)")


if __name__ == "__main__":
    main()
