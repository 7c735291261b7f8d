"""The live node and the simulator run one request lifecycle.

The same events are fed to the lifecycle as ``Node.generate`` builds it and
as a simulated node builds it, each over its own router with the same view;
the same actions must come out, and the routers must end in the same state.
"""

from __future__ import annotations

from typing import Any

from p2pinfer.core import LOCAL, Load
from p2pinfer.core.attempts import DeadlinePassed, Done, Event, PeerLost, Refused
from p2pinfer.core.policies import Candidate, Decision
from p2pinfer.lab.node_process import fast_config
from p2pinfer.node import Node
from p2pinfer.sim import SimConfig, Simulator

PEERS = [f"12D3KooWpeer{i}" for i in range(5)]
PROMPT = list(range(300, 300 + 16 * 10))

SEQUENCES: list[list[Event]] = [
    [Refused("BUSY"), PeerLost("reset"), Refused("BUSY"), Done(0)],  # three peers, then local
    [Refused("BUSY"), Done(64)],
    [PeerLost("stall", generated=3), Done(160, generated=5)],
    [Refused("MODEL_MISMATCH"), Refused("INTERNAL"), DeadlinePassed("late")],
    [Done(0)],  # an overclaim, repeated below until the peer is sanctioned
]


def decision() -> Decision:
    cands = [Candidate(p, 160, 10.0 + i) for i, p in enumerate(PEERS[:4])]
    cands.insert(2, Candidate(LOCAL, 0, 30.0))
    return Decision("cost", cands[0].target, 160, "test", tuple(cands))


def run(make: Any, router: Any, sequence: list[Event], repeat: int = 1) -> list[Any]:
    """Feed ``sequence`` (``repeat`` times, one request each); returns the
    actions, the attempts and the router's view of each peer afterwards."""
    for p in PEERS:
        router.on_load(p, Load(0, 4.0), False, 0.0)
    out: list[Any] = []
    for _ in range(repeat):
        life = make(decision(), PROMPT, router.hasher.hashes(PROMPT))
        actions = [life.start()]
        for event in sequence:
            actions.append(life.handle(event, 1.0))
        out.append(actions)
        out.append([(a.local, a.target if not a.local else "self", a.outcome, a.resumed_tokens) for a in life.attempts])
    view = {p: (s.backing_off(1.5), s.is_distrusted(1.5), round(s.trust, 6)) if (s := router.view.get(p)) else None for p in PEERS}
    return [out, view]


async def test_the_same_events_give_the_same_actions_on_a_node_and_in_the_simulator(mmlu_300: Any) -> None:
    _, (reqs, encoder, info) = mmlu_300
    sim = Simulator(SimConfig(nodes=1), reqs, encoder, workload=info)
    async with Node(fast_config()) as node:
        for i, sequence in enumerate(SEQUENCES):
            repeat = 3 if i == len(SEQUENCES) - 1 else 1
            sim_node = sim._add_node()
            for p in PEERS:
                node.router.on_peer_gone(p)  # a fresh view for each sequence

            def node_make(d: Decision, t: list[int], h: list[int]) -> Any:
                return node.new_attempts(d, t, h, max_tokens=8)

            def sim_make(d: Decision, t: list[int], h: list[int]) -> Any:
                life = sim_node.new_attempts(d, t, h)
                life.max_tokens = 8  # the simulator never streams tokens back; the same limit here
                return life

            live = run(node_make, node.router, sequence, repeat)
            simulated = run(sim_make, sim_node.router, sequence, repeat)
            assert live == simulated, f"sequence {i}"
    # The repeated overclaim did end in a sanction, on both.
    requests = live[0][0::2]
    assert any(type(a).__name__ == "Sanction" for actions in requests for step in actions for a in step)
