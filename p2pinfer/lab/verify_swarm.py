"""TEST ONLY: helpers of the answer-check tests between node processes
(tests/reliability/test_wrong_tokens_short.py, test_delegated_checks_short.py).

The simulated engine's answers are a pure function of the tokens
(:func:`~p2pinfer.engines.simulated.simulated_next_token`), so a test knows
the honest answer to any prompt without asking a node.
"""

from __future__ import annotations

import random
from typing import Any

from ..core.router import RouterConfig
from ..core.verify import VerifyConfig
from ..engines.simulated import simulated_next_token
from ..net.config import NodeConfig
from .node_process import NodeProcess

__all__ = ["eligible", "honest_answer", "random_tokens", "with_verify"]


def random_tokens(seed: int, n: int) -> list[int]:
    """``n`` token ids drawn from ``seed`` (above the special and byte tokens)."""
    rng = random.Random(seed)
    return [rng.randrange(256, 49152) for _ in range(n)]


def honest_answer(prompt: list[int], n: int) -> list[int]:
    """What an honest simulated engine answers to ``prompt`` in ``n`` greedy tokens."""
    seq = list(prompt)
    for _ in range(n):
        seq.append(simulated_next_token(seq))
    return seq[len(prompt):]


def with_verify(config: NodeConfig, **verify: Any) -> NodeConfig:
    """``config`` with its router's :class:`~p2pinfer.core.verify.VerifyConfig` set from ``verify``."""
    r = config.router
    return config.replace(router=RouterConfig(policy=r.policy, gossip=r.gossip, busy_queue_ms=r.busy_queue_ms,
                                              verify=VerifyConfig(**verify)))


def eligible(node: NodeProcess, peers: list[str]) -> bool:
    """Whether ``node`` may send work to every one of ``peers`` now (its view says so)."""
    view = node.call("view")
    return all(view.get(p, {}).get("eligible") for p in peers)
