"""Mutation fuzzing of everything a peer or a client can send us.

Each target starts from valid seed messages and derives malformed ones from
them (bit flips, truncation, insertion, deletion, duplication, splicing,
random bytes, and field values at and past their limits), feeds them to the
real decoder, and checks the one rule: the decoder either returns a value or
raises the *one* error type it documents, within a memory bound. Anything
else (another exception type, a crash, an allocation past the bound) is a
finding. ``p2pinfer bench fuzz`` runs it; the test suite runs a short version.

The ``http`` target sends the malformed bodies to a live node's API and
requires an OpenAI-style 4xx answer (never a 5xx, never a dropped
connection), and a node that still answers a good request afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
import json
import random
import tracemalloc
from typing import Any

__all__ = ["FuzzReport", "TARGETS", "fuzz_target", "mutations", "run_fuzz"]

MEMORY_BOUND_BYTES = 64 << 20


@dataclass
class FuzzReport:
    target: str
    inputs: int = 0
    accepted: int = 0
    rejected: int = 0
    findings: list[str] = field(default_factory=list)
    peak_memory_bytes: int = 0
    error_type: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "inputs": self.inputs,
            "accepted": self.accepted,
            "rejected_with_documented_error": self.rejected,
            "findings": len(self.findings),
            "finding_examples": self.findings[:5],
            "peak_memory_mib": round(self.peak_memory_bytes / 2**20, 2),
            "documented_error": self.error_type,
        }


def mutations(seeds: list[bytes], rng: random.Random) -> Iterator[bytes]:
    """An endless stream of inputs derived from ``seeds``."""
    while True:
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.choice((1, 1, 2, 3, 8))):
            op = rng.randrange(9)
            if op == 0 and data:  # flip bits
                i = rng.randrange(len(data))
                data[i] ^= 1 << rng.randrange(8)
            elif op == 1 and data:  # truncate
                del data[rng.randrange(len(data)) :]
            elif op == 2:  # insert random bytes
                i = rng.randrange(len(data) + 1)
                data[i:i] = rng.randbytes(rng.choice((1, 2, 4, 9)))
            elif op == 3 and data:  # delete a slice
                i = rng.randrange(len(data))
                del data[i : i + rng.randrange(1, 16)]
            elif op == 4 and data:  # duplicate a slice
                i = rng.randrange(len(data))
                chunk = data[i : i + rng.randrange(1, 64)]
                data[i:i] = chunk * rng.randrange(1, 4)
            elif op == 5:  # splice with another seed
                other = rng.choice(seeds)
                cut = rng.randrange(len(other) + 1)
                data = data[: rng.randrange(len(data) + 1)] + bytearray(other[cut:])
            elif op == 6 and data:  # interesting byte values
                i = rng.randrange(len(data))
                data[i] = rng.choice((0x00, 0x7F, 0x80, 0xFF, 0xBF, 0x9F, 0x5B, 0x1B))
            elif op == 7:  # pure noise
                data = bytearray(rng.randbytes(rng.randrange(0, 256)))
            elif op == 8 and data:  # overwrite with a huge varint / length
                i = rng.randrange(len(data))
                data[i : i + 1] = b"\xff\xff\xff\xff\xff\xff\xff\xff\x7f"
        yield bytes(data)


def _digest_target() -> tuple[list[bytes], Callable[[bytes], Any], type[BaseException]]:
    from ..core.digest import Digest, DigestError, decode_digest, encode_digest

    seeds = [
        encode_digest(Digest("full", "12D3KooWnode", "abcdef0123456789", 7, 0, frozenset(range(1, 40)), epoch=99)),
        encode_digest(Digest("delta", "n", "f", 9, 8, frozenset({1, 2, 3}), frozenset({4}), epoch=1)),
        encode_digest(Digest("full", "n", "f", 0, 0, frozenset())),
    ]
    return seeds, decode_digest, DigestError


def _request_target() -> tuple[list[bytes], Callable[[bytes], Any], type[BaseException]]:
    from ..engines.base import GenerationParams
    from ..net.wire import WireError, decode_request, encode_request

    def decode(data: bytes) -> Any:
        return decode_request(data, fingerprint="abcdef0123456789", max_hops=1, max_tokens=8192)

    seeds = [
        encode_request(request_id=b"r" * 16, tokens=list(range(200)), params=GenerationParams(max_tokens=8),
                       hops=1, deadline_ms=5000, fingerprint="abcdef0123456789", predicted_match_tokens=160,
                       origin="12D3KooWorigin"),
        encode_request(request_id=b"x", tokens=[5], params=GenerationParams(max_tokens=1, temperature=0.7, stop=("\n",)),
                       hops=1, deadline_ms=0, fingerprint="abcdef0123456789", predicted_match_tokens=0, origin="o",
                       resumed_tokens=1),
    ]
    return seeds, decode, WireError


def _response_target() -> tuple[list[bytes], Callable[[bytes], Any], type[BaseException]]:
    from ..engines.base import GenerationRecord, TokenChunk
    from ..net.wire import WireError, decode_response, encode_chunk, encode_done, encode_error

    seeds = [
        encode_chunk(TokenChunk((1, 2, 3), "abc")),
        encode_done(GenerationRecord(100, 96, 8, 0.05, 0.2, "length"), "12D3KooWserver"),
        encode_error("BUSY", "queue full"),
    ]
    return seeds, decode_response, WireError


def _gossip_target() -> tuple[list[bytes], Callable[[bytes], Any], type[BaseException]]:
    from ..core.digest import Digest, encode_digest
    from ..core.peers import Load
    from ..net.wire import GossipRejected, decode_gossip, encode_gossip_digest, encode_gossip_load, load_to_pb

    sender, fp = "12D3KooWsender", "abcdef0123456789"

    def decode(data: bytes) -> Any:
        return decode_gossip(data, sender=sender, fingerprint=fp)

    seeds = [
        encode_gossip_digest(encode_digest(Digest("full", sender, fp, 3, 0, frozenset(range(10)), epoch=5))),
        encode_gossip_load(load_to_pb(sender, fp, Load(100, 4.3, 1), True, 5, 3, ["/ip4/127.0.0.1/tcp/4001"])),
    ]
    return seeds, decode, GossipRejected


def _check_request_target() -> tuple[list[bytes], Callable[[bytes], Any], type[BaseException]]:
    from ..net.wire import WireError, decode_check_request, encode_check_request

    fp = "abcdef0123456789"

    def decode(data: bytes) -> Any:
        return decode_check_request(data, fingerprint=fp, vocab_size=49152)

    seeds = [encode_check_request(fp, list(range(300)), [5, 6, 7, 8], 1.0), encode_check_request(fp, [1], [2], 0.7)]
    return seeds, decode, WireError


def _check_response_target() -> tuple[list[bytes], Callable[[bytes], Any], type[BaseException]]:
    from ..net.wire import PeerScore, RemoteError, WireError, decode_check_response, encode_check_error, encode_check_response

    answer = [5, 6, 7]

    def decode(data: bytes) -> Any:
        try:
            return decode_check_response(data, answer)
        except RemoteError as exc:  # a refusal is a valid answer: what the caller gets for it
            return exc

    seeds = [
        encode_check_response([PeerScore(t, -0.5, -0.1, -1.2, 0.4) for t in answer], 12),
        encode_check_error("BUSY", "2 checks of peers running"),
    ]
    return seeds, decode, WireError


def _pull_request_target() -> tuple[list[bytes], Callable[[bytes], Any], type[BaseException]]:
    from ..net.wire import WireError, decode_pull_request, encode_pull_request

    return [encode_pull_request("abcdef0123456789", 16), encode_pull_request("ff", 0)], decode_pull_request, WireError


def _pull_response_target() -> tuple[list[bytes], Callable[[bytes], Any], type[BaseException]]:
    from ..core.digest import Digest, encode_digest
    from ..core.peers import Load
    from ..net.wire import GossipRejected, RemoteError, decode_pull_response, encode_pull_error, encode_pull_response, load_to_pb

    sender, fp = "12D3KooWsender", "abcdef0123456789"

    def decode(data: bytes) -> Any:
        try:
            return decode_pull_response(data, sender=sender, fingerprint=fp)
        except RemoteError as exc:  # a refusal is a valid answer: what the caller gets for it
            return exc

    seeds = [
        encode_pull_response(encode_digest(Digest("full", sender, fp, 3, 0, frozenset(range(40)), epoch=2)),
                             load_to_pb(sender, fp, Load(100, 4.3, 1), True, 5, 3, ["/ip4/127.0.0.1/tcp/4001"]),
                             [("12D3KooWother", ["/ip4/127.0.0.1/tcp/4002"])]),
        encode_pull_error("BUSY", "pull limit"),
    ]
    return seeds, decode, GossipRejected


def _model_announcement_target() -> tuple[list[bytes], Callable[[bytes], Any], type[BaseException]]:
    from ..net.wire import GossipRejected, decode_model_announcement, encode_model_announcement

    sender = "12D3KooWsender"

    def decode(data: bytes) -> Any:
        return decode_model_announcement(data, sender=sender)

    seeds = [encode_model_announcement(sender, "abcdef0123456789", "smollm2-135m", ["/ip4/127.0.0.1/tcp/4001"])]
    return seeds, decode, GossipRejected


def _dialback_request_target() -> tuple[list[bytes], Callable[[bytes], Any], type[BaseException]]:
    from ..net.wire import WireError, decode_dialback_request, encode_dialback_request

    seeds = [encode_dialback_request(b"n" * 16, ["/ip4/10.0.0.2/tcp/4001", "/ip4/10.0.0.2/udp/4001/quic-v1"])]
    return seeds, decode_dialback_request, WireError


def _dialback_response_target() -> tuple[list[bytes], Callable[[bytes], Any], type[BaseException]]:
    from ..net.wire import WireError, decode_dialback_response, encode_dialback_response

    seeds = [encode_dialback_response("ok", addr="/ip4/10.0.0.2/tcp/4001", observed_ip="10.0.0.2"),
             encode_dialback_response("refused", message="rate limit")]
    return seeds, decode_dialback_response, WireError


def _dialback_proof_target() -> tuple[list[bytes], Callable[[bytes], Any], type[BaseException]]:
    from ..net.wire import WireError, decode_dialback_proof, encode_dialback_proof

    return [encode_dialback_proof(b"n" * 16)], decode_dialback_proof, WireError


def _directory_target() -> tuple[list[bytes], Callable[[bytes], Any], type[BaseException]]:
    from ..core.directory import (
        AnchorCheck, AnchorUpdate, Answer, AnswerHolder, DirectoryConfig, DirectoryError, Refusal, Register, Resend,
        decode_message, encode_message, make_query,
    )
    from ..core.peers import Load

    load = Load(120, 4.3, 1, 4, 2, 12.5, True)
    hashes = [(0x9E3779B97F4A7C15 * (i + 1)) % (1 << 64) for i in range(40)]
    query = make_query(hashes, 640, DirectoryConfig())
    assert query is not None
    seeds = [
        encode_message(Register("12D3KooWholder", 7, load, (AnchorUpdate(hashes[0], False, frozenset(hashes[1:20]),
                                                                          frozenset(hashes[20:24])),
                                                              AnchorUpdate(hashes[30], True, frozenset(hashes[31:]))),
                                (AnchorCheck(hashes[0], 19, 12345),))),
        encode_message(Resend((hashes[0], hashes[30]))),
        encode_message(query),
        encode_message(Answer(hashes[0], (AnswerHolder("12D3KooWholder", 18, load, 1.25),))),
        encode_message(Refusal("NOT_HOLDER", "register for another peer")),
    ]
    return seeds, decode_message, DirectoryError


TARGETS: dict[str, Callable[[], tuple[list[bytes], Callable[[bytes], Any], type[BaseException]]]] = {
    "digest": _digest_target,
    "request": _request_target,
    "response": _response_target,
    "gossip": _gossip_target,
    "check-request": _check_request_target,
    "check-response": _check_response_target,
    "pull-request": _pull_request_target,
    "pull-response": _pull_response_target,
    "model-announcement": _model_announcement_target,
    "dialback-request": _dialback_request_target,
    "dialback-response": _dialback_response_target,
    "dialback-proof": _dialback_proof_target,
    "directory": _directory_target,
}


def fuzz_target(name: str, count: int, seed: int = 1) -> FuzzReport:
    """Run ``count`` malformed inputs through the decoder ``name``."""
    seeds, decode, allowed = TARGETS[name]()
    report = FuzzReport(name, error_type=allowed.__name__)
    rng = random.Random(seed)
    tracemalloc.start()
    try:
        for data in mutations(seeds, rng):
            if report.inputs >= count:
                break
            report.inputs += 1
            tracemalloc.reset_peak()
            try:
                decode(data)
                report.accepted += 1
            except allowed:
                report.rejected += 1
            except Exception as exc:  # noqa: BLE001 - that is the finding
                report.findings.append(f"{type(exc).__name__}: {exc} on {data[:64].hex()}")
            peak = tracemalloc.get_traced_memory()[1]
            report.peak_memory_bytes = max(report.peak_memory_bytes, peak)
            if peak > MEMORY_BOUND_BYTES:
                report.findings.append(f"allocated {peak} bytes on {data[:64].hex()}")
    finally:
        tracemalloc.stop()
    return report


def http_bodies(count: int, seed: int) -> Iterator[tuple[str, bytes]]:
    """Malformed request bodies for the two generation endpoints."""
    good = [
        ("/v1/completions", json.dumps({"prompt": "The sky is", "max_tokens": 2}).encode()),
        ("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()),
        ("/v1/completions", json.dumps({"prompt": "x", "max_tokens": 1, "stream": True, "stop": ["\n"], "temperature": 0.5}).encode()),
    ]
    structural = [
        b'{"prompt": null}', b'{"prompt": ["a", "b"]}', b'{"prompt": "x", "max_tokens": 1e999}',
        b'{"prompt": "x", "max_tokens": 99999999999999999999999}', b'{"messages": [{}]}', b'{"messages": "hi"}',
        b'{"prompt": "x", "stop": [1]}', b'{"prompt": "x", "seed": -1}', b'[' * 10000 + b']' * 10000,
        b'{"prompt": "' + b'\\ud800' * 10 + b'"}', b'{"prompt": "x", "stream": "yes"}', b'',
        b'{"prompt": "x", "top_p": 0}', b'{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}',
    ]
    rng = random.Random(seed)
    stream = mutations([g[1] for g in good] + structural, rng)
    for i in range(count):
        path = good[i % 2][0]
        yield path, next(stream)


async def fuzz_http(base_url: str, count: int, seed: int = 1, concurrency: int = 8) -> FuzzReport:
    """Send malformed bodies to a live node; every answer must be a 2xx or an OpenAI-style 4xx."""
    import httpx
    import trio

    report = FuzzReport("http", error_type="HTTP 4xx with an OpenAI error object")
    bodies = iter(list(http_bodies(count, seed)))
    async with httpx.AsyncClient(timeout=httpx.Timeout(30.0)) as client:

        async def worker() -> None:
            for path, body in bodies:
                report.inputs += 1
                try:
                    r = await client.post(base_url + path, content=body, headers={"content-type": "application/json"})
                except httpx.HTTPError as exc:
                    report.findings.append(f"no answer ({type(exc).__name__}) to {body[:64]!r}")
                    continue
                if r.status_code == 200:
                    report.accepted += 1
                elif 400 <= r.status_code < 500 and "error" in _json_or_empty(r):
                    report.rejected += 1
                else:
                    report.findings.append(f"HTTP {r.status_code} {r.text[:120]!r} to {body[:64]!r}")

        async with trio.open_nursery() as nursery:
            for _ in range(concurrency):
                nursery.start_soon(worker)
        r = await client.post(base_url + "/v1/completions", json={"prompt": "still serving?", "max_tokens": 1})
        if r.status_code != 200:
            report.findings.append(f"node stopped serving good requests: HTTP {r.status_code}")
    return report


def _json_or_empty(r: Any) -> dict[str, Any]:
    try:
        value = r.json()
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def run_fuzz(targets: list[str], count: int, seed: int) -> dict[str, object]:
    """``p2pinfer bench fuzz``: every decoder target, and ``http`` against a real node process."""
    reports = [fuzz_target(t, count, seed).as_dict() for t in targets if t in TARGETS]
    if "http" in targets:
        import trio

        from .local_swarm import LocalSwarm

        with LocalSwarm(1, engine="simulated") as swarm:
            report = trio.run(fuzz_http, swarm.nodes[0].http, count, seed)
            alive = swarm.nodes[0].alive()
        out = report.as_dict()
        out["node_alive_after"] = alive
        if not alive:
            out["findings"] = int(out["findings"]) + 1  # type: ignore[call-overload]
        reports.append(out)
    return {"benchmark": "fuzz", "count_per_target": count, "seed": seed, "targets": reports,
            "findings": sum(int(r["findings"]) for r in reports)}  # type: ignore[call-overload]
