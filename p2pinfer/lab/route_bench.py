"""``p2pinfer bench route``: time from a prompt's token ids to a routing decision."""

from __future__ import annotations

import random
import statistics
import time


def run_route_bench(
    peers: int,
    prompt_tokens: int,
    blocks_per_peer: int,
    holders: int,
    policy_name: str,
    iterations: int,
    seed: int,
    secret: bytes | None = None,
) -> dict[str, object]:
    """Build a view of ``peers`` peers and time ``iterations`` decisions.

    Every peer's digest holds ``blocks_per_peer`` block hashes (unrelated
    cached prefixes), and ``holders`` of them also hold a prefix of the
    prompt of a random length, so the index has real work to do.
    """
    from ..core import BlockHasher, Digest, Load, LocalState, ModelFingerprint, PeerView, RouteRequest, make_policy

    rng = random.Random(seed)
    fp = ModelFingerprint("bench-model", "bench-tok", "bench-tpl")
    hasher = BlockHasher(fp, secret)
    view = PeerView(fp.hex(), "self")
    prompts = [[rng.randrange(49152) for _ in range(prompt_tokens)] for _ in range(8)]
    prompt_hashes = [hasher.hashes(p) for p in prompts]
    now = 1000.0
    for i in range(peers):
        peer_id = f"peer-{i:04d}"
        hashes = {rng.getrandbits(64) for _ in range(blocks_per_peer)}
        digest = Digest("full", peer_id, fp.hex(), 1, 0, frozenset(hashes))
        view.apply_digest(digest, now)
        view.update_load(peer_id, Load(rng.randrange(0, 4000), 4.35, rng.randrange(0, 4)), now)
        view.set_rtt(peer_id, rng.uniform(0.5, 20.0), now)
    for hashes in prompt_hashes:
        for j in rng.sample(range(peers), min(holders, peers)):
            peer_id = f"peer-{j:04d}"
            cut = rng.randrange(1, len(hashes) + 1)
            state = view.get(peer_id)
            assert state is not None
            extra = Digest("delta", peer_id, fp.hex(), state.version + 1, state.version, frozenset(hashes[:cut]))
            view.apply_digest(extra, now)
    policy = make_policy(policy_name)
    local = LocalState("self", 0, Load(1000, 4.35, 1))
    decide_rng = random.Random(seed)
    samples: list[float] = []
    hash_samples: list[float] = []
    for it in range(iterations + 50):
        tokens = prompts[it % len(prompts)]
        t0 = time.perf_counter_ns()
        block_hashes = hasher.hashes(tokens)
        t1 = time.perf_counter_ns()
        policy.decide(RouteRequest(len(tokens), block_hashes, fp.block_size), local, view, now, decide_rng)
        t2 = time.perf_counter_ns()
        if it >= 50:  # warm-up
            samples.append((t2 - t0) / 1000)
            hash_samples.append((t1 - t0) / 1000)
    samples.sort()
    return {
        "benchmark": "route",
        "policy": policy_name,
        "peers": peers,
        "prompt_tokens": prompt_tokens,
        "prompt_blocks": prompt_tokens // fp.block_size,
        "blocks_per_peer": blocks_per_peer,
        "tokens_per_peer": blocks_per_peer * fp.block_size,
        "peers_holding_prompt_prefix": min(holders, peers),
        "indexed_hashes": view.hashes_indexed(),
        "keyed_hashes": bool(secret),
        "iterations": iterations,
        "decision_us_p50": round(statistics.median(samples), 2),
        "decision_us_p99": round(samples[int(0.99 * (len(samples) - 1))], 2),
        "decision_us_mean": round(statistics.fmean(samples), 2),
        "hashing_us_p50": round(statistics.median(hash_samples), 2),
    }
