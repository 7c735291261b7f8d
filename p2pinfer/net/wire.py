"""Encoding and strict decoding of every message in protos/p2pinfer.proto.

The rest of the node works with Python values (``GenerationParams``,
``TokenChunk``, :class:`~p2pinfer.core.peers.Load`...); this module is the
only place that sees protobuf objects, so each limit and each check is
written once. Decoders raise :class:`WireError` carrying the error code to
answer with, and nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
import math
import re
from typing import TypeVar

from google.protobuf.message import DecodeError

from ..core.digest import MAX_DIGEST_BYTES, Digest, DigestError, decode_digest
from ..core.peers import MAX_REPORTED_SLOT_WAIT_MS, MAX_REPORTED_SLOTS, Load
from ..core.verify import MAX_DELEGATED_CHECK_TOKENS
from ..engines.base import MAX_TOP_LOGPROBS, GenerationParams, GenerationRecord, InvalidRequestError, TokenChunk, TokenLogprob
from .proto import p2pinfer_pb2 as pb

__all__ = [
    "ERROR_CODES",
    "GOSSIP_MAX_BYTES",
    "PULL_REQUEST_MAX_BYTES",
    "GENERATE_VERSION",
    "MODEL_ANNOUNCEMENT_MAX_BYTES",
    "WIRE_VERSION",
    "ChatLine",
    "Done",
    "ModelAnnouncement",
    "GossipRejected",
    "LoadInfo",
    "RemoteError",
    "WireError",
    "fingerprint_in_message",
    "mismatch_message",
]

WIRE_VERSION = 1
"""Gossip and digest-pull messages."""
GENERATE_VERSION = 2
"""``GenerateRequest`` and ``GenerateResponse``. 2: sampling fields (penalties,
grammar, logprobs), logprobs in chunks, delegated requests (text or messages)."""
MODEL_ANNOUNCEMENT_MAX_BYTES = 8192
MAX_ALIAS_LEN = 256
MAX_TOOLS_JSON = 256 * 1024
MAX_DELEGATED_MESSAGES = 256
GOSSIP_MAX_BYTES = 1024 * 1024 - 16 * 1024
"""Gossipsub carries at most 1 MiB per RPC (as go-libp2p-pubsub); the rest is
signature, ids and topic. A digest over this size (more than ~129k blocks,
about 2 M cached tokens) is not gossiped: peers learn its version from load
reports and pull it over a stream (``PULL_RESPONSE_MAX_BYTES``)."""
PULL_REQUEST_MAX_BYTES = 4096
PULL_RESPONSE_MAX_BYTES = MAX_DIGEST_BYTES + 256 * 1024
MAX_ADDRS = 16
MAX_SLOTS = MAX_REPORTED_SLOTS
"""Most slots a load report may claim."""
MAX_SLOT_WAIT_MS = MAX_REPORTED_SLOT_WAIT_MS
"""Longest wait for a free slot a load report may claim (one hour)."""
MAX_RELAY_ADDRS = 4
MAX_ADDR_LEN = 256
MAX_PEER_RECORDS = 256
RESPONSE_MAX_BYTES = 256 * 1024
"""A chunk or a final record is small; anything larger is an attack."""

ERROR_CODES: dict[int, str] = {
    value.number: value.name for value in pb.DESCRIPTOR.enum_types_by_name["ErrorCode"].values
}


class WireError(Exception):
    """A message we received is invalid; ``code`` is the answer to give."""

    def __init__(self, code: str, message: str, *, fingerprint: str | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.fingerprint = fingerprint
        """For MODEL_MISMATCH: the fingerprint the sender claimed."""


def mismatch_message(ours: str, theirs: str | None = None) -> str:
    """The text of a MODEL_MISMATCH error: it always names the refusing node's fingerprint.

    The requester learns from it which model the peer runs (for its log and
    status) without a new message type: see :func:`fingerprint_in_message`.
    """
    tail = "" if theirs is None else f", not {theirs[:64]!r}"
    return f"this node serves model fingerprint {ours}{tail}"


_FP_RE = re.compile(r"model fingerprint ([0-9a-f]{1,64})")


def fingerprint_in_message(message: str) -> str | None:
    """The fingerprint a MODEL_MISMATCH message names, or ``None``."""
    found = _FP_RE.search(message)
    return found.group(1) if found else None


class RemoteError(Exception):
    """The peer answered a request with an error record."""

    def __init__(self, code: str, message: str, peer: str = "") -> None:
        super().__init__(f"{code} from {peer or 'peer'}: {message}")
        self.code = code
        self.message = message
        self.peer = peer


class GossipRejected(Exception):
    """A gossip message failed validation; ``reason`` is a short metric label."""

    def __init__(self, reason: str, detail: str = "", *, fingerprint: str | None = None) -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.fingerprint = fingerprint
        """For ``other-model``: the fingerprint the message claimed."""


# -- generation parameters ---------------------------------------------------------


def params_to_pb(params: GenerationParams) -> pb.GenerationParams:
    return pb.GenerationParams(
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        has_seed=params.seed is not None,
        seed=params.seed or 0,
        stop=list(params.stop),
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
        repetition_penalty=params.repetition_penalty,
        grammar=params.grammar or "",
        logprobs=params.logprobs,
        top_logprobs=params.top_logprobs,
    )


def params_from_pb(msg: pb.GenerationParams) -> GenerationParams:
    """Raises :class:`InvalidRequestError` for impossible values."""
    for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
        if not math.isfinite(getattr(msg, name)):
            raise InvalidRequestError(f"{name} must be a finite number")
    params = GenerationParams(
        max_tokens=msg.max_tokens,
        # float32 on the wire: round so 0.7 stays 0.7 after the trip.
        temperature=round(msg.temperature, 6),
        top_p=round(msg.top_p, 6),
        top_k=msg.top_k,
        seed=msg.seed if msg.has_seed else None,
        stop=tuple(msg.stop),
        presence_penalty=round(msg.presence_penalty, 6),
        frequency_penalty=round(msg.frequency_penalty, 6),
        repetition_penalty=round(msg.repetition_penalty, 6),
        grammar=msg.grammar or None,
        logprobs=msg.logprobs,
        top_logprobs=msg.top_logprobs,
    )
    params.validate()
    return params


# -- /p2pinfer/generate/1.0.0 ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChatLine:
    """One chat message of a delegated request."""

    role: str
    content: str


def encode_request(
    *,
    request_id: bytes,
    tokens: Sequence[int],
    params: GenerationParams,
    hops: int,
    deadline_ms: int,
    fingerprint: str,
    predicted_match_tokens: int,
    origin: str,
    resumed_tokens: int = 0,
    prompt_text: str = "",
    messages: Sequence[ChatLine] = (),
    tools_json: str = "",
) -> bytes:
    """``prompt_text`` or ``messages`` instead of ``tokens``: a delegated request."""
    return pb.GenerateRequest(
        version=GENERATE_VERSION,
        request_id=request_id,
        token_ids=list(tokens),
        params=params_to_pb(params),
        hops=hops,
        deadline_ms=max(0, min(deadline_ms, 2**32 - 1)),
        model_fingerprint=fingerprint,
        predicted_match_tokens=max(0, predicted_match_tokens),
        origin=origin,
        resumed_tokens=resumed_tokens,
        prompt_text=prompt_text,
        messages=[pb.ChatMessage(role=m.role, content=m.content) for m in messages],
        tools_json=tools_json,
    ).SerializeToString()


@dataclass(frozen=True, slots=True)
class Request:
    request_id: bytes
    tokens: list[int]
    params: GenerationParams
    hops: int
    deadline_ms: int
    fingerprint: str
    predicted_match_tokens: int
    origin: str
    resumed_tokens: int
    prompt_text: str = ""
    messages: tuple[ChatLine, ...] = ()
    tools_json: str = ""

    @property
    def delegated(self) -> bool:
        """The origin does not serve this model: it sent text, this node tokenises and routes."""
        return not self.tokens


def decode_request(data: bytes, *, fingerprint: str, max_hops: int, max_tokens: int) -> Request:
    """Parse and check a request; raises :class:`WireError` with the code to answer."""
    msg = pb.GenerateRequest()
    try:
        msg.ParseFromString(data)
    except DecodeError as exc:
        raise WireError("BAD_REQUEST", f"not a GenerateRequest: {exc}") from None
    if msg.version != GENERATE_VERSION:
        raise WireError("BAD_REQUEST", f"request version {msg.version}; this node speaks {GENERATE_VERSION}")
    if msg.model_fingerprint != fingerprint:
        raise WireError(
            "MODEL_MISMATCH", mismatch_message(fingerprint, msg.model_fingerprint), fingerprint=msg.model_fingerprint[:64]
        )
    if not 1 <= msg.hops <= max_hops:
        raise WireError("HOP_LIMIT", f"request has taken {msg.hops} hops; at most {max_hops} allowed")
    if not 1 <= len(msg.request_id) <= 64:
        raise WireError("BAD_REQUEST", "request_id must be 1..64 bytes")
    if len(msg.token_ids) > max_tokens:
        raise WireError("TOO_LARGE", f"{len(msg.token_ids)} prompt tokens; this node takes at most {max_tokens}")
    if msg.resumed_tokens > len(msg.token_ids):
        raise WireError("BAD_REQUEST", "resumed_tokens exceeds the prompt")
    if not msg.HasField("params"):
        raise WireError("BAD_REQUEST", "generation parameters are missing")
    forms = sum((bool(msg.token_ids), bool(msg.prompt_text), bool(msg.messages)))
    if forms != 1:
        raise WireError("BAD_REQUEST", "exactly one of token_ids, prompt_text and messages must be set")
    if len(msg.messages) > MAX_DELEGATED_MESSAGES:
        raise WireError("TOO_LARGE", f"{len(msg.messages)} messages; at most {MAX_DELEGATED_MESSAGES}")
    if len(msg.tools_json) > MAX_TOOLS_JSON:
        raise WireError("TOO_LARGE", f"tools_json of {len(msg.tools_json)} characters; at most {MAX_TOOLS_JSON}")
    if msg.tools_json and not msg.messages:
        raise WireError("BAD_REQUEST", "tools_json needs messages")
    try:
        params = params_from_pb(msg.params)
    except InvalidRequestError as exc:
        raise WireError("BAD_REQUEST", str(exc)) from None
    return Request(
        request_id=msg.request_id,
        tokens=list(msg.token_ids),
        params=params,
        hops=msg.hops,
        deadline_ms=msg.deadline_ms,
        fingerprint=msg.model_fingerprint,
        predicted_match_tokens=msg.predicted_match_tokens,
        origin=msg.origin[:128],
        resumed_tokens=msg.resumed_tokens,
        prompt_text=msg.prompt_text,
        messages=tuple(ChatLine(m.role, m.content) for m in msg.messages),
        tools_json=msg.tools_json,
    )


@dataclass(frozen=True, slots=True)
class Done:
    """The final record of a forwarded generation, as the target reported it."""

    record: GenerationRecord
    served_by: str


def encode_chunk(chunk: TokenChunk) -> bytes:
    logprobs = [
        pb.TokenLogprob(
            token_id=lp.token_id, piece=lp.piece, logprob=lp.logprob,
            top=[pb.TopLogprob(token_id=t, piece=b, logprob=v) for t, b, v in lp.top],
        )
        for lp in chunk.logprobs
    ]
    return pb.GenerateResponse(
        version=GENERATE_VERSION,
        chunk=pb.TokenChunk(token_ids=list(chunk.token_ids), text=chunk.text, logprobs=logprobs),
    ).SerializeToString()


def _logprobs_from_pb(chunk: pb.TokenChunk) -> tuple[TokenLogprob, ...]:
    if not chunk.logprobs:
        return ()
    if len(chunk.logprobs) != len(chunk.token_ids):
        raise WireError("BAD_REQUEST", "logprobs must come one per token")
    out = []
    for lp, token in zip(chunk.logprobs, chunk.token_ids):
        values = [lp.logprob, *(t.logprob for t in lp.top)]
        if lp.token_id != token or len(lp.top) > MAX_TOP_LOGPROBS or not all(math.isfinite(v) or v == -math.inf for v in values) or any(v > 0 for v in values):
            raise WireError("BAD_REQUEST", "logprobs out of range")
        out.append(TokenLogprob(lp.token_id, lp.piece[:64], lp.logprob, tuple((t.token_id, t.piece[:64], t.logprob) for t in lp.top)))
    return tuple(out)


def encode_done(record: GenerationRecord, served_by: str) -> bytes:
    return pb.GenerateResponse(
        version=GENERATE_VERSION,
        done=pb.GenerateDone(
            prompt_tokens=record.prompt_tokens,
            reused_tokens=record.reused_tokens,
            generated_tokens=record.generated_tokens,
            ttft_s=record.ttft_s,
            total_s=record.total_s,
            finish_reason=record.finish_reason,
            queue_s=record.queue_s,
            served_by=served_by,
        ),
    ).SerializeToString()


def encode_error(code: str, message: str) -> bytes:
    return pb.GenerateResponse(
        version=GENERATE_VERSION, error=pb.Error(code=pb.ErrorCode.Value(code), message=message[:1024])
    ).SerializeToString()


_FINISH = {"stop", "length", "cancelled", "error"}


def decode_response(data: bytes, peer: str = "") -> TokenChunk | Done | RemoteError:
    """Parse one response frame; raises :class:`WireError` when it is malformed."""
    msg = pb.GenerateResponse()
    try:
        msg.ParseFromString(data)
    except DecodeError as exc:
        raise WireError("BAD_REQUEST", f"not a GenerateResponse: {exc}") from None
    if msg.version != GENERATE_VERSION:
        raise WireError("BAD_REQUEST", f"response version {msg.version}; this node speaks {GENERATE_VERSION}")
    kind = msg.WhichOneof("body")
    if kind == "chunk":
        return TokenChunk(tuple(msg.chunk.token_ids), msg.chunk.text, _logprobs_from_pb(msg.chunk))
    if kind == "done":
        d = msg.done
        if d.finish_reason not in _FINISH:
            raise WireError("BAD_REQUEST", f"unknown finish reason {d.finish_reason!r}")
        times = (d.ttft_s, d.total_s, d.queue_s)
        if not all(math.isfinite(t) and t >= 0 for t in times):
            raise WireError("BAD_REQUEST", "timings must be finite and non-negative")
        if d.reused_tokens > d.prompt_tokens:
            raise WireError("BAD_REQUEST", "reused_tokens exceeds prompt_tokens")
        record = GenerationRecord(
            prompt_tokens=d.prompt_tokens,
            reused_tokens=d.reused_tokens,
            generated_tokens=d.generated_tokens,
            ttft_s=d.ttft_s,
            total_s=d.total_s,
            finish_reason=d.finish_reason,  # type: ignore[arg-type]
            queue_s=d.queue_s,
        )
        return Done(record, d.served_by[:128])
    if kind == "error":
        code = ERROR_CODES.get(msg.error.code, "INTERNAL")
        return RemoteError(code, msg.error.message[:1024], peer)
    raise WireError("BAD_REQUEST", "empty response")


# -- gossip and digest pull ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LoadInfo:
    """A peer's load report, checked."""

    node_id: str
    load: Load
    busy: bool
    epoch: int
    digest_version: int
    addrs: tuple[str, ...]
    reachability: str = "unknown"
    """``public``, ``private`` or ``unknown`` (see :mod:`.reachability`)."""
    relay_addrs: tuple[str, ...] = ()
    """Circuit addresses (``.../p2p/<relay>/p2p-circuit``) where the node holds a reservation."""
    relay_service: bool = False
    """The node offers circuit relay v2 to others."""


REACHABILITY_NAMES = {pb.REACHABILITY_UNKNOWN: "unknown", pb.REACHABILITY_PUBLIC: "public", pb.REACHABILITY_PRIVATE: "private"}
_REACHABILITY_VALUES = {v: k for k, v in REACHABILITY_NAMES.items()}


def load_to_pb(
    node_id: str,
    fingerprint: str,
    load: Load,
    busy: bool,
    epoch: int,
    version: int,
    addrs: Sequence[str],
    *,
    reachability: str = "unknown",
    relay_addrs: Sequence[str] = (),
    relay_service: bool = False,
) -> pb.LoadReport:
    return pb.LoadReport(
        node_id=node_id,
        model_fingerprint=fingerprint,
        queued_prefill_tokens=min(max(0, load.queued_prefill_tokens), 2**32 - 1),
        prefill_ms_per_token=load.prefill_ms_per_token,
        active_requests=min(max(0, load.active_requests), 2**32 - 1),
        slots=min(max(1, load.slots), MAX_SLOTS),
        free_slots=min(max(0, load.free_slots), max(1, load.slots), MAX_SLOTS),
        slot_wait_ms=min(max(0.0, load.slot_wait_ms), MAX_SLOT_WAIT_MS),
        busy=busy,
        epoch=epoch,
        digest_version=version,
        addrs=list(addrs)[:MAX_ADDRS],
        reachability=_REACHABILITY_VALUES.get(reachability, pb.REACHABILITY_UNKNOWN),
        relay_addrs=list(relay_addrs)[:MAX_RELAY_ADDRS],
        relay_service=relay_service,
        prefill_speed_unmeasured=not load.speed_measured,
    )


def _bad_addrs(addrs: Sequence[str], limit: int) -> bool:
    return len(addrs) > limit or any(len(a) > MAX_ADDR_LEN or not a.startswith("/") for a in addrs)


def load_from_pb(msg: pb.LoadReport, *, sender: str, fingerprint: str) -> LoadInfo:
    if msg.node_id != sender:
        raise GossipRejected("spoofed", f"load report for {msg.node_id!r} signed by {sender}")
    if msg.model_fingerprint != fingerprint:
        raise GossipRejected("other-model", f"fingerprint {msg.model_fingerprint!r}", fingerprint=msg.model_fingerprint[:64])
    ms = msg.prefill_ms_per_token
    if not (math.isfinite(ms) and 0.0 <= ms <= 1e5):
        raise GossipRejected("malformed", "prefill_ms_per_token out of range")
    if _bad_addrs(msg.addrs, MAX_ADDRS):
        raise GossipRejected("malformed", "bad address list")
    if _bad_addrs(msg.relay_addrs, MAX_RELAY_ADDRS) or any("/p2p-circuit" not in a for a in msg.relay_addrs):
        raise GossipRejected("malformed", "bad relay address list")
    if msg.reachability not in REACHABILITY_NAMES:
        raise GossipRejected("malformed", f"unknown reachability {msg.reachability}")
    if msg.epoch >= 1 << 63 or msg.digest_version >= 1 << 63:
        raise GossipRejected("malformed", "epoch or version out of range")
    slots, free, wait = msg.slots, msg.free_slots, msg.slot_wait_ms
    if slots > MAX_SLOTS or free > max(1, slots):
        raise GossipRejected("malformed", "slots out of range")
    if not (math.isfinite(wait) and 0.0 <= wait <= MAX_SLOT_WAIT_MS):
        raise GossipRejected("malformed", "slot_wait_ms out of range")
    if slots == 0:  # a node from before continuous batching: one request at a time
        slots, free, wait = 1, (0 if msg.active_requests else 1), 0.0
    return LoadInfo(
        node_id=sender,
        load=Load(
            msg.queued_prefill_tokens, ms, msg.active_requests, slots, free, wait,
            speed_measured=not msg.prefill_speed_unmeasured,
        ),
        busy=msg.busy,
        epoch=msg.epoch,
        digest_version=msg.digest_version,
        addrs=tuple(msg.addrs),
        reachability=REACHABILITY_NAMES[msg.reachability],
        relay_addrs=tuple(msg.relay_addrs),
        relay_service=msg.relay_service,
    )


def encode_gossip_digest(digest_bytes: bytes) -> bytes:
    return pb.GossipMessage(version=WIRE_VERSION, digest=digest_bytes).SerializeToString()


def encode_gossip_load(report: pb.LoadReport) -> bytes:
    return pb.GossipMessage(version=WIRE_VERSION, load=report).SerializeToString()


_Gossip = TypeVar("_Gossip", pb.GossipMessage, pb.ModelAnnouncement)


def _parse_gossip(msg: _Gossip, data: bytes, max_bytes: int, what: str) -> _Gossip:
    """The checks every pubsub payload gets first: size, protobuf, wire version."""
    if len(data) > max_bytes:
        raise GossipRejected("oversized", f"{len(data)} bytes")
    try:
        msg.ParseFromString(data)
    except DecodeError as exc:
        raise GossipRejected("malformed", str(exc)) from None
    if msg.version != WIRE_VERSION:
        raise GossipRejected("version", f"{what} version {msg.version}")
    return msg


def decode_gossip(data: bytes, *, sender: str, fingerprint: str) -> Digest | LoadInfo:
    """Validate one gossip payload from ``sender`` (the libp2p-signed origin)."""
    msg = _parse_gossip(pb.GossipMessage(), data, GOSSIP_MAX_BYTES, "gossip")
    kind = msg.WhichOneof("body")
    if kind == "digest":
        try:
            digest = decode_digest(msg.digest)
        except DigestError as exc:
            raise GossipRejected("malformed", str(exc)) from None
        if digest.node_id != sender:
            raise GossipRejected("spoofed", f"digest of {digest.node_id!r} signed by {sender}")
        if digest.fingerprint != fingerprint:
            raise GossipRejected("other-model", f"fingerprint {digest.fingerprint!r}", fingerprint=digest.fingerprint)
        return digest
    if kind == "load":
        return load_from_pb(msg.load, sender=sender, fingerprint=fingerprint)
    raise GossipRejected("malformed", "empty gossip message")


def encode_pull_request(fingerprint: str, max_peers: int) -> bytes:
    return pb.DigestPullRequest(
        version=WIRE_VERSION, model_fingerprint=fingerprint, max_peers=max_peers
    ).SerializeToString()


def decode_pull_request(data: bytes) -> pb.DigestPullRequest:
    msg = pb.DigestPullRequest()
    try:
        msg.ParseFromString(data)
    except DecodeError as exc:
        raise WireError("BAD_REQUEST", f"not a DigestPullRequest: {exc}") from None
    if msg.version != WIRE_VERSION:
        raise WireError("BAD_REQUEST", f"pull version {msg.version}; this node speaks {WIRE_VERSION}")
    return msg


@dataclass(frozen=True, slots=True)
class PullResult:
    digest: Digest
    load: LoadInfo | None
    peers: tuple[tuple[str, tuple[str, ...]], ...]


def decode_pull_response(data: bytes, *, sender: str, fingerprint: str) -> PullResult:
    """Raises :class:`RemoteError` for a refusal, :class:`GossipRejected` for a bad answer."""
    msg = pb.DigestPullResponse()
    try:
        msg.ParseFromString(data)
    except DecodeError as exc:
        raise GossipRejected("malformed", str(exc)) from None
    if msg.version != WIRE_VERSION:
        raise GossipRejected("version", f"pull response version {msg.version}")
    if msg.HasField("error"):
        raise RemoteError(ERROR_CODES.get(msg.error.code, "INTERNAL"), msg.error.message[:1024], sender)
    try:
        digest = decode_digest(msg.digest)
    except DigestError as exc:
        raise GossipRejected("malformed", str(exc)) from None
    if digest.node_id != sender:
        raise GossipRejected("spoofed", f"pulled digest of {digest.node_id!r} from {sender}")
    if digest.fingerprint != fingerprint:
        raise GossipRejected("other-model", f"fingerprint {digest.fingerprint!r}", fingerprint=digest.fingerprint)
    load = load_from_pb(msg.load, sender=sender, fingerprint=fingerprint) if msg.HasField("load") else None
    peers: list[tuple[str, tuple[str, ...]]] = []
    for rec in msg.peers[:MAX_PEER_RECORDS]:
        addrs = tuple(a for a in rec.addrs[:MAX_ADDRS] if len(a) <= MAX_ADDR_LEN and a.startswith("/"))
        if 0 < len(rec.peer_id) <= 128 and addrs:
            peers.append((rec.peer_id, addrs))
    return PullResult(digest, load, tuple(peers))


def encode_pull_response(
    digest_bytes: bytes, load: pb.LoadReport, peers: Sequence[tuple[str, Sequence[str]]]
) -> bytes:
    return pb.DigestPullResponse(
        version=WIRE_VERSION,
        digest=digest_bytes,
        load=load,
        peers=[pb.PeerRecord(peer_id=p, addrs=list(a)[:MAX_ADDRS]) for p, a in peers[:MAX_PEER_RECORDS]],
    ).SerializeToString()


def encode_pull_error(code: str, message: str) -> bytes:
    return pb.DigestPullResponse(
        version=WIRE_VERSION, error=pb.Error(code=pb.ErrorCode.Value(code), message=message[:1024])
    ).SerializeToString()


# -- /p2pinfer/models/1 -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ModelAnnouncement:
    """A node says which model it serves, checked."""

    node_id: str
    fingerprint: str
    alias: str
    addrs: tuple[str, ...]


_FINGERPRINT_RE = re.compile(r"[0-9a-f]{1,64}")


def encode_model_announcement(node_id: str, fingerprint: str, alias: str, addrs: Sequence[str]) -> bytes:
    return pb.ModelAnnouncement(
        version=WIRE_VERSION,
        node_id=node_id,
        model_fingerprint=fingerprint,
        model_alias=alias[:MAX_ALIAS_LEN],
        addrs=list(addrs)[:MAX_ADDRS],
    ).SerializeToString()


def decode_model_announcement(data: bytes, *, sender: str) -> ModelAnnouncement:
    """Validate one announcement from ``sender`` (the libp2p-signed origin)."""
    msg = _parse_gossip(pb.ModelAnnouncement(), data, MODEL_ANNOUNCEMENT_MAX_BYTES, "model announcement")
    if msg.node_id != sender:
        raise GossipRejected("spoofed", f"announcement for {msg.node_id!r} signed by {sender}")
    if not _FINGERPRINT_RE.fullmatch(msg.model_fingerprint):
        raise GossipRejected("malformed", "model_fingerprint must be 1..64 lowercase hex digits")
    alias = msg.model_alias
    if not 1 <= len(alias) <= MAX_ALIAS_LEN or not alias.isprintable():
        raise GossipRejected("malformed", "model_alias must be 1..256 printable characters")
    if len(msg.addrs) > MAX_ADDRS or any(len(a) > MAX_ADDR_LEN or not a.startswith("/") for a in msg.addrs):
        raise GossipRejected("malformed", "bad address list")
    return ModelAnnouncement(sender, msg.model_fingerprint, alias, tuple(msg.addrs))


# -- /p2pinfer/reachability/1.0.0 and /p2pinfer/dialback/1.0.0 -------------------------------

DIALBACK_MAX_BYTES = 4096
DIALBACK_NONCE_BYTES = 16
MAX_DIALBACK_ADDRS = 8
DIALBACK_STATUS_NAMES = {
    pb.DIAL_BACK_OK: "ok",
    pb.DIAL_BACK_FAILED: "failed",
    pb.DIAL_BACK_NO_MATCH: "no-match",
    pb.DIAL_BACK_REFUSED: "refused",
}
_DIALBACK_STATUS_VALUES = {v: k for k, v in DIALBACK_STATUS_NAMES.items()}


@dataclass(frozen=True, slots=True)
class DialBackAnswer:
    status: str
    """``ok``, ``failed``, ``no-match`` or ``refused``."""
    addr: str = ""
    observed_ip: str = ""
    message: str = ""


def encode_dialback_request(nonce: bytes, addrs: Sequence[str]) -> bytes:
    return pb.DialBackRequest(version=WIRE_VERSION, nonce=nonce, addrs=list(addrs)[:MAX_DIALBACK_ADDRS]).SerializeToString()


def decode_dialback_request(data: bytes) -> tuple[bytes, list[str]]:
    msg = pb.DialBackRequest()
    try:
        msg.ParseFromString(data)
    except DecodeError as exc:
        raise WireError("BAD_REQUEST", f"not a DialBackRequest: {exc}") from None
    if msg.version != WIRE_VERSION:
        raise WireError("BAD_REQUEST", f"dial-back version {msg.version}; this node speaks {WIRE_VERSION}")
    if len(msg.nonce) != DIALBACK_NONCE_BYTES:
        raise WireError("BAD_REQUEST", f"nonce must be {DIALBACK_NONCE_BYTES} bytes")
    if _bad_addrs(msg.addrs, MAX_DIALBACK_ADDRS):
        raise WireError("BAD_REQUEST", "bad address list")
    return bytes(msg.nonce), list(msg.addrs)


def encode_dialback_response(status: str, *, addr: str = "", observed_ip: str = "", message: str = "") -> bytes:
    return pb.DialBackResponse(
        version=WIRE_VERSION,
        status=_DIALBACK_STATUS_VALUES[status],
        addr=addr[:MAX_ADDR_LEN],
        observed_ip=observed_ip[:64],
        message=message[:1024],
    ).SerializeToString()


def decode_dialback_response(data: bytes) -> DialBackAnswer:
    msg = pb.DialBackResponse()
    try:
        msg.ParseFromString(data)
    except DecodeError as exc:
        raise WireError("BAD_REQUEST", f"not a DialBackResponse: {exc}") from None
    if msg.version != WIRE_VERSION:
        raise WireError("BAD_REQUEST", f"dial-back version {msg.version}; this node speaks {WIRE_VERSION}")
    status = DIALBACK_STATUS_NAMES.get(msg.status)
    if status is None:
        raise WireError("BAD_REQUEST", f"unknown dial-back status {msg.status}")
    return DialBackAnswer(status, msg.addr[:MAX_ADDR_LEN], msg.observed_ip[:64], msg.message[:1024])


def encode_dialback_proof(nonce: bytes) -> bytes:
    return pb.DialBackProof(version=WIRE_VERSION, nonce=nonce).SerializeToString()


def decode_dialback_proof(data: bytes) -> bytes:
    msg = pb.DialBackProof()
    try:
        msg.ParseFromString(data)
    except DecodeError as exc:
        raise WireError("BAD_REQUEST", f"not a DialBackProof: {exc}") from None
    if msg.version != WIRE_VERSION or len(msg.nonce) != DIALBACK_NONCE_BYTES:
        raise WireError("BAD_REQUEST", "bad dial-back proof")
    return bytes(msg.nonce)


# -- /p2pinfer/check/1.0.0 --------------------------------------------------------------------

CHECK_VERSION = 1
CHECK_MAX_PROMPT_TOKENS = 32768
"""The longest prompt a check carries (longer than any context this node family runs)."""
CHECK_MAX_ANSWER_TOKENS = MAX_DELEGATED_CHECK_TOKENS
"""The most answer tokens one check scores (``VerifyConfig`` refuses a larger
``max_checked_tokens`` while delegation is on)."""
CHECK_REQUEST_MAX_BYTES = 5 * (CHECK_MAX_PROMPT_TOKENS + CHECK_MAX_ANSWER_TOKENS) + 1024
"""Token ids are varints of at most 5 bytes."""
CHECK_RESPONSE_MAX_BYTES = 32 * CHECK_MAX_ANSWER_TOKENS + 2048
_LOGPROB_SLACK = 1e-3
"""Float32 rounding: a log-probability may read a hair above 0 or above the best one."""


@dataclass(frozen=True, slots=True)
class CheckQuery:
    """What a verifier is asked to score (a decoded CheckRequest)."""

    prompt: list[int]
    answer: list[int]
    temperature: float


@dataclass(frozen=True, slots=True)
class PeerScore:
    """One answer token's score as a verifier sent it (satisfies :class:`~p2pinfer.core.verify.Scored`)."""

    token_id: int
    logprob: float
    best_logprob: float
    mean_logprob: float
    var_logprob: float


@dataclass(frozen=True, slots=True)
class CheckScores:
    """A verifier's answer: its scores and the tokens it evaluated for them."""

    scores: tuple[PeerScore, ...]
    evaluated_tokens: int


def encode_check_request(fingerprint: str, prompt: Sequence[int], answer: Sequence[int], temperature: float) -> bytes:
    return pb.CheckRequest(
        version=CHECK_VERSION, model_fingerprint=fingerprint, prompt_ids=list(prompt), answer_ids=list(answer),
        temperature=temperature,
    ).SerializeToString()


def decode_check_request(data: bytes, *, fingerprint: str, vocab_size: int) -> CheckQuery:
    """Raises :class:`WireError` (BAD_REQUEST, TOO_LARGE, MODEL_MISMATCH) for a request not to serve."""
    msg = pb.CheckRequest()
    try:
        msg.ParseFromString(data)
    except DecodeError as exc:
        raise WireError("BAD_REQUEST", f"not a CheckRequest: {exc}") from None
    if msg.version != CHECK_VERSION:
        raise WireError("BAD_REQUEST", f"check version {msg.version}; this node speaks {CHECK_VERSION}")
    if msg.model_fingerprint != fingerprint:
        raise WireError("MODEL_MISMATCH", mismatch_message(fingerprint, msg.model_fingerprint))
    if not msg.prompt_ids or not msg.answer_ids:
        raise WireError("BAD_REQUEST", "a check needs a prompt and at least one answer token")
    if len(msg.prompt_ids) > CHECK_MAX_PROMPT_TOKENS or len(msg.answer_ids) > CHECK_MAX_ANSWER_TOKENS:
        raise WireError("TOO_LARGE", f"a check carries at most {CHECK_MAX_PROMPT_TOKENS} prompt and "
                        f"{CHECK_MAX_ANSWER_TOKENS} answer tokens (got {len(msg.prompt_ids)} and {len(msg.answer_ids)})")
    bad = next((t for t in (*msg.prompt_ids, *msg.answer_ids) if t >= vocab_size), None)
    if bad is not None:
        raise WireError("BAD_REQUEST", f"token id {bad} is outside the vocabulary (0..{vocab_size - 1})")
    if not math.isfinite(msg.temperature) or not 0.0 < msg.temperature <= 100.0:
        raise WireError("BAD_REQUEST", f"temperature must be in (0, 100] (got {msg.temperature})")
    return CheckQuery(list(msg.prompt_ids), list(msg.answer_ids), float(msg.temperature))


def encode_check_response(scores: Sequence[PeerScore] | Sequence[object], evaluated_tokens: int) -> bytes:
    """``scores``: :class:`PeerScore` or the engine's :class:`~p2pinfer.engines.base.PositionScore` (same fields)."""
    return pb.CheckResponse(
        version=CHECK_VERSION,
        scores=[pb.CheckScore(token_id=s.token_id, logprob=s.logprob, best_logprob=s.best_logprob,  # type: ignore[attr-defined]
                              mean_logprob=s.mean_logprob, var_logprob=s.var_logprob) for s in scores],  # type: ignore[attr-defined]
        evaluated_tokens=max(0, evaluated_tokens),
    ).SerializeToString()


def encode_check_error(code: str, message: str) -> bytes:
    return pb.CheckResponse(
        version=CHECK_VERSION, error=pb.Error(code=pb.ErrorCode.Value(code), message=message[:1024])
    ).SerializeToString()


def decode_check_response(data: bytes, answer: Sequence[int], *, peer: str = "") -> CheckScores:
    """The verifier's scores of ``answer``. Raises :class:`RemoteError` for a
    refusal and :class:`WireError` for an answer that cannot be a real model's
    scores of ``answer`` (other tokens, another count, impossible values)."""
    msg = pb.CheckResponse()
    try:
        msg.ParseFromString(data)
    except DecodeError as exc:
        raise WireError("BAD_REQUEST", f"not a CheckResponse: {exc}") from None
    if msg.version != CHECK_VERSION:
        raise WireError("BAD_REQUEST", f"check response version {msg.version}; this node speaks {CHECK_VERSION}")
    if msg.HasField("error"):
        raise RemoteError(ERROR_CODES.get(msg.error.code, "INTERNAL"), msg.error.message[:1024], peer)
    if len(msg.scores) != len(answer):
        raise WireError("BAD_REQUEST", f"{len(msg.scores)} scores for an answer of {len(answer)} tokens")
    out = []
    for i, (s, token) in enumerate(zip(msg.scores, answer)):
        values = (s.logprob, s.best_logprob, s.mean_logprob, s.var_logprob)
        if s.token_id != token:
            raise WireError("BAD_REQUEST", f"score {i} is of token {s.token_id}, the answer has {token} there")
        if (not all(math.isfinite(v) for v in values) or s.logprob > _LOGPROB_SLACK
                or s.best_logprob > _LOGPROB_SLACK or s.logprob > s.best_logprob + _LOGPROB_SLACK
                or s.mean_logprob > _LOGPROB_SLACK or s.var_logprob < 0.0):
            raise WireError("BAD_REQUEST", f"score {i} is not a distribution's: {values}")
        out.append(PeerScore(s.token_id, s.logprob, s.best_logprob, s.mean_logprob, s.var_logprob))
    return CheckScores(tuple(out), msg.evaluated_tokens)
