"""A content-sharded prefix directory: who caches what, without telling everyone.

Gossiping every cache change to every node costs each node O(swarm size)
bytes (docs/results.md, issue 6: 960 KB/s per node at 256 nodes). The
directory instead shards the knowledge by content:

* the **anchor** of a token sequence is the chained hash of its block at
  depth ``anchor_blocks`` (1-based; e.g. 4 blocks = 64 tokens). Chained
  hashes make the anchor stand for the whole prefix up to it, so every
  sequence that shares those first tokens shares the anchor;
* the **directory node** of an anchor is chosen by rendezvous
  (highest-random-weight) hashing over the current membership: every node
  computes the same owner, and a node joining or leaving moves only the
  anchors it wins or held (:class:`Rendezvous`);
* **holders** send the owner of each anchor they hold small register
  updates (blocks added and removed under that anchor, batched) with their
  load piggybacked, and a refresh now and then (a checksum per anchor; the
  owner asks back for the anchors that do not match), so that a lost
  update, an expired record or a new owner heals (:class:`AnchorTracker`);
* an **entry node** asks the owner of the request's anchor (one round trip)
  and gets back the best few holders with their match length and last load
  (:class:`DirectoryStore`); it then runs the *same* ``CostPolicy`` over them
  plus the peers it already knows (:class:`DirectoryView`, :func:`apply_answer`).

Per node, bytes grow with the node's own cache changes and requests, not
with the swarm size; an owner's grow with its anchors' popularity. Prefix
matches shorter than the anchor depth are not found through the directory,
and a shared system prompt longer than the anchor depth sends every request
to one owner (a deeper anchor or replicas fix it).

Pure and sans-I/O: messages are CBOR bytes in and out, time is passed in.
The wire format is versioned, size-limited and strictly decoded
(:class:`DirectoryError`), like :mod:`p2pinfer.core.digest`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
import hashlib
import math
import struct
from typing import Any

import base58
import cbor2
import xxhash

from .blocks import BlockHasher
from .peers import MAX_REPORTED_SLOT_WAIT_MS, MAX_REPORTED_SLOTS, Load, PeerState, PeerView
from .radix import TreeEvent
from .strict_cbor import loads_strict

__all__ = [
    "DIRECTORY_SCHEMA",
    "MAX_ANSWER_HOLDERS",
    "MAX_DIRECTORY_BYTES",
    "MAX_QUERY_BLOCKS",
    "MAX_REGISTER_HASHES",
    "AnchorCheck",
    "AnchorTracker",
    "Answer",
    "AnswerHolder",
    "AnchorUpdate",
    "KademliaPlacement",
    "PLACEMENTS",
    "REFUSAL_CODES",
    "Refusal",
    "anchor_key",
    "kademlia_distance",
    "make_placement",
    "DirectoryConfig",
    "DirectoryError",
    "DirectoryLimit",
    "DirectoryStore",
    "DirectoryView",
    "Query",
    "Register",
    "Rendezvous",
    "Resend",
    "anchor_of",
    "apply_answer",
    "askable_owners",
    "decode_message",
    "make_query",
    "encode_message",
    "rendezvous_weight",
    "vouched_by",
    "xor_of",
]

DIRECTORY_SCHEMA = 2
"""2: loads carry the slot fields of continuous batching (slots, free slots, wait for one) and
whether the prefill speed is measured."""
MAX_REGISTER_HASHES = 1 << 16
"""Most block hashes in one register message (1 M tokens at block size 16)."""
MAX_REGISTER_ANCHORS = 4096
MAX_QUERY_BLOCKS = 4096
"""Most block hashes a query carries (65,536 tokens past the anchor)."""
MAX_ANSWER_HOLDERS = 64
MAX_ID_LEN = 128
MAX_DIRECTORY_BYTES = 64 + 8 * MAX_REGISTER_HASHES + 32 * MAX_REGISTER_ANCHORS + 4096
"""Upper bound on any encoded directory message; checked before decoding."""
_U64 = struct.Struct("<Q")
_MAX_U64 = (1 << 64) - 1


class DirectoryError(ValueError):
    """A directory message could not be decoded or breaks the schema."""


class DirectoryLimit(DirectoryError):
    """A register would put its holder over ``max_blocks_per_holder``."""


@dataclass(frozen=True, slots=True)
class DirectoryConfig:
    """Knobs of the directory, shared by holders, owners and entries."""

    anchor_blocks: int = 4
    """Depth of the anchor block (4 blocks of 16 tokens: 64 tokens)."""
    replicas: int = 1
    """Owners per anchor: holders register with each, entries ask the first alive."""
    answer_holders: int = 8
    """Holders an answer carries at most (the cheapest by the directory's estimate)."""
    update_interval_s: float = 1.0
    """Holders batch their register updates and send them at most this often."""
    refresh_s: float = 30.0
    """Each holder refreshes its registration of every anchor this often."""
    refresh: str = "checksum"
    """``checksum``: a refresh sends each anchor's block count and XOR of
    hashes, and the directory asks (in its reply) for the full set of the
    anchors that do not match; ``full``: it re-sends every block (the
    busiest owner's largest inbound term at 1,024 nodes, docs/results.md)."""
    entry_ttl_s: float = 75.0
    """A directory forgets a holder's record not refreshed for this long."""
    query_timeout_s: float = 0.25
    """An entry that has no answer by then asks again (the next replica),
    and after ``query_attempts`` tries decides with what it knows."""
    query_attempts: int = 2
    query_stride: int = 4
    """A query carries every ``query_stride``-th block hash past the anchor,
    then every hash of the last ``query_tail`` blocks: a long prompt's query
    is about that much smaller, and an answer understates a match by fewer
    than ``query_stride`` blocks only when the prompts part before the tail."""
    query_tail: int = 16
    """Blocks at the end of a query sent densely: where requests that share a
    prefix usually part (the new question, the new turn)."""
    max_blocks_per_holder: int = 1 << 16
    """Blocks one holder may have registered at one directory node (1 M tokens at
    16 per block, more than any engine's cache); a register past it is refused
    (``LIMIT``) and that holder's records dropped: an owner's memory is bounded
    per peer."""
    max_holders: int = 4096
    """Holders one directory node keeps records of; a new one past it takes the
    place of the one heard from least recently."""
    placement: str = "rendezvous"
    """Who owns an anchor: ``kademlia``, the peers closest to its key in
    py-libp2p's KadDHT keyspace (:class:`KademliaPlacement`, what the live
    node runs: ``p2pinfer.net.directory``); ``rendezvous``, highest-random-
    weight hashing over the membership (:class:`Rendezvous`; the default of
    the simulator's published directory runs, which predate the live node)."""

    def __post_init__(self) -> None:
        if min(self.anchor_blocks, self.replicas, self.query_stride, self.query_tail, self.query_attempts,
               self.max_blocks_per_holder, self.max_holders) < 1:
            raise ValueError("anchor_blocks, replicas, query_stride, query_tail, query_attempts, "
                             "max_blocks_per_holder and max_holders must be >= 1")
        if not 1 <= self.answer_holders <= MAX_ANSWER_HOLDERS:
            raise ValueError(f"answer_holders must be in 1..{MAX_ANSWER_HOLDERS}")
        if min(self.update_interval_s, self.refresh_s, self.entry_ttl_s, self.query_timeout_s) <= 0:
            raise ValueError("intervals and timeouts must be > 0")
        if self.entry_ttl_s <= self.refresh_s:
            raise ValueError(f"entry_ttl_s ({self.entry_ttl_s}) must exceed refresh_s ({self.refresh_s}): entries would expire before their refresh")
        if self.refresh not in ("full", "checksum"):
            raise ValueError("refresh must be full or checksum")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}")


def anchor_of(block_hashes: Sequence[int], anchor_blocks: int) -> int | None:
    """The anchor of a sequence with these chained block hashes, or ``None``
    when it is shorter than the anchor depth (it is not in the directory)."""
    if len(block_hashes) < anchor_blocks:
        return None
    return block_hashes[anchor_blocks - 1]


def make_query(block_hashes: Sequence[int], prompt_tokens: int, config: DirectoryConfig) -> Query | None:
    """The query for a request with these block hashes (``None``: shorter than the anchor)."""
    k = config.anchor_blocks
    if len(block_hashes) < k:
        return None
    n = min(len(block_hashes), k - 1 + MAX_QUERY_BLOCKS)  # at most MAX_QUERY_BLOCKS hashes
    stride, tail = config.query_stride, config.query_tail
    depths = _sampled_depths(k, n, stride, tail)
    return Query(
        block_hashes[k - 1], k, stride, tail, n, tuple(block_hashes[d - 1] for d in depths), prompt_tokens, config.answer_holders
    )


def _sampled_depths(depth: int, blocks: int, stride: int, tail: int) -> list[int]:
    dense_from = max(depth, blocks - tail + 1)
    return [*range(depth, dense_from, stride), *range(dense_from, blocks + 1)]


def _sampled_count(depth: int, blocks: int, stride: int, tail: int) -> int:
    """``len(_sampled_depths(...))`` without building it (for untrusted input)."""
    dense_from = max(depth, blocks - tail + 1)
    return -(-(dense_from - depth) // stride) + (blocks - dense_from + 1)


# -- placement ------------------------------------------------------------------


def rendezvous_weight(key: int, member: str) -> int:
    """Highest-random-weight score of ``member`` for ``key`` (same on every node)."""
    return xxhash.xxh3_64_intdigest(member.encode(), seed=key & _MAX_U64)


class Rendezvous:
    """Rendezvous hashing over a membership, with a per-key cache of owners.

    A join only compares the newcomer with each cached key's owners (one
    hash per key); a leave recomputes only the keys the leaver owned. Both
    return the keys whose owners changed, so holders know what to re-register.
    """

    def __init__(self, members: Iterable[str] = (), replicas: int = 1) -> None:
        if replicas < 1:
            raise ValueError("replicas must be >= 1")
        self.replicas = replicas
        self._members: dict[str, None] = dict.fromkeys(sorted(members))
        self._owners: dict[int, list[tuple[int, str]]] = {}
        """key -> [(weight, member)] best first, at most ``replicas`` long."""

    def __contains__(self, member: object) -> bool:
        return member in self._members

    def __len__(self) -> int:
        return len(self._members)

    def members(self) -> list[str]:
        return list(self._members)

    def _weight(self, key: int, member: str) -> int:
        """Higher is a better owner of ``key``."""
        return rendezvous_weight(key, member)

    def _compute(self, key: int) -> list[tuple[int, str]]:
        scored = sorted(((self._weight(key, m), m) for m in self._members), reverse=True)
        return scored[: self.replicas]

    def owners(self, key: int) -> list[str]:
        """The ``replicas`` owners of ``key``, best first (empty without members)."""
        cached = self._owners.get(key)
        if cached is None:
            cached = self._compute(key)
            self._owners[key] = cached
        return [m for _, m in cached]

    def keys(self) -> list[int]:
        """Keys whose owners are cached."""
        return list(self._owners)

    def placed(self) -> int:
        """Keys whose owners are cached (anchors looked up so far)."""
        return len(self._owners)

    def owner(self, key: int) -> str | None:
        owners = self.owners(key)
        return owners[0] if owners else None

    def add(self, member: str) -> list[int]:
        """Admit ``member``; returns the cached keys whose owners changed."""
        if member in self._members:
            return []
        self._members[member] = None
        changed = []
        for key, best in self._owners.items():
            w = self._weight(key, member)
            if len(best) < self.replicas or (w, member) > best[-1]:
                best.append((w, member))
                best.sort(reverse=True)
                del best[self.replicas :]
                changed.append(key)
        return changed

    def remove(self, member: str) -> list[int]:
        """Drop ``member``; returns the cached keys whose owners changed."""
        if member not in self._members:
            return []
        del self._members[member]
        changed = [key for key, best in self._owners.items() if any(m == member for _, m in best)]
        for key in changed:
            self._owners[key] = self._compute(key)
        return changed


_KAD_MAX = (1 << 256) - 1
ANCHOR_KEY_PREFIX = b"/p2pinfer/anchor/"


def anchor_key(anchor: int) -> bytes:
    """The Kademlia key of an anchor: 25 bytes, within the 2..50 bytes that
    py-libp2p's FIND_NODE accepts as a key."""
    return ANCHOR_KEY_PREFIX + anchor.to_bytes(8, "big")


def kademlia_member_key(member: str) -> bytes:
    """A member's place in the Kademlia keyspace: SHA-256 of its peer id's
    bytes (base58-decoded), as py-libp2p's routing table computes it
    (``libp2p.kad_dht.routing_table.peer_id_to_key``)."""
    try:
        raw = base58.b58decode(member)
    except ValueError:
        raw = member.encode()
    return hashlib.sha256(raw).digest()


def kademlia_distance(key: bytes, member: str) -> int:
    """XOR distance between ``sha256(key)`` and a member, py-libp2p's metric
    (``libp2p.kad_dht.utils.sort_peer_ids_by_distance``)."""
    target = int.from_bytes(hashlib.sha256(key).digest(), "big")
    return target ^ int.from_bytes(kademlia_member_key(member), "big")


class KademliaPlacement(Rendezvous):
    """The owners of an anchor are the members closest to its key in the
    Kademlia keyspace (XOR of SHA-256s, :func:`kademlia_distance`): the
    peers a DHT lookup of :func:`anchor_key` converges to. The live node
    feeds it the peers of py-libp2p's ``KadDHT`` routing table; the simulator
    feeds it its membership. Same interface and join/leave bookkeeping as
    :class:`Rendezvous`."""

    def __init__(self, members: Iterable[str] = (), replicas: int = 1) -> None:
        self._member_keys: dict[str, int] = {}
        super().__init__(members, replicas)

    def _weight(self, key: int, member: str) -> int:
        mk = self._member_keys.get(member)
        if mk is None:
            mk = self._member_keys[member] = int.from_bytes(kademlia_member_key(member), "big")
        target = int.from_bytes(hashlib.sha256(anchor_key(key)).digest(), "big")
        return _KAD_MAX - (target ^ mk)

    def remove(self, member: str) -> list[int]:
        changed = super().remove(member)
        self._member_keys.pop(member, None)
        return changed


PLACEMENTS = ("kademlia", "rendezvous")


def make_placement(config: DirectoryConfig, members: Iterable[str] = ()) -> Rendezvous:
    """The placement ``config.placement`` names."""
    cls = KademliaPlacement if config.placement == "kademlia" else Rendezvous
    return cls(members, config.replicas)


# -- the holder side -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AnchorUpdate:
    """Blocks under one anchor: added and removed since the last update, or
    (``full``) every block held under it (an empty full update unregisters)."""

    anchor: int
    full: bool = False
    added: frozenset[int] = field(default_factory=frozenset)
    removed: frozenset[int] = field(default_factory=frozenset)


class AnchorTracker:
    """Follows a :class:`~p2pinfer.core.radix.RadixTree`: which blocks this
    node holds under which anchor, and what changed since the last update.

    Only blocks at depth ``anchor_blocks`` or deeper are tracked (the anchor
    itself included): shallower ones are implied by the anchor.
    """

    def __init__(self, hasher: BlockHasher, anchor_blocks: int) -> None:
        if anchor_blocks < 1:
            raise ValueError("anchor_blocks must be >= 1")
        self.hasher = hasher
        self.anchor_blocks = anchor_blocks
        self._held: dict[int, set[int]] = {}
        self._added: dict[int, set[int]] = {}
        self._removed: dict[int, set[int]] = {}

    def anchors(self) -> list[int]:
        return list(self._held)

    def held(self, anchor: int) -> frozenset[int]:
        return frozenset(self._held.get(anchor, ()))

    @property
    def pending(self) -> int:
        return sum(map(len, self._added.values())) + sum(map(len, self._removed.values()))

    def on_event(self, event: TreeEvent) -> None:
        bs = self.hasher.block_size
        k = self.anchor_blocks
        first = max(event.start // bs, k - 1)  # first block that changed and is tracked
        chain = self.hasher.hashes(event.path)
        if len(chain) < k or first >= len(chain):
            return
        anchor = chain[k - 1]
        held = self._held.setdefault(anchor, set())
        added = self._added.setdefault(anchor, set())
        removed = self._removed.setdefault(anchor, set())
        if event.kind == "insert":
            for h in chain[first:]:
                if h not in held:
                    held.add(h)
                    if h in removed:
                        removed.discard(h)
                    else:
                        added.add(h)
        else:
            for h in chain[first:]:
                if h in held:
                    held.discard(h)
                    if h in added:
                        added.discard(h)
                    else:
                        removed.add(h)
        if not held:
            del self._held[anchor]
        if not added:
            del self._added[anchor]
        if not removed:
            del self._removed[anchor]

    def on_event_insert(self, path: tuple[int, ...]) -> None:
        """Count an already cached sequence (an engine that starts warm)."""
        self.on_event(TreeEvent("insert", tuple(path), 0))

    def checks(self) -> list[AnchorCheck]:
        """Count and XOR of the blocks held under each anchor (a cheap refresh)."""
        return [AnchorCheck(a, len(hs), xor_of(hs)) for a, hs in sorted(self._held.items())]

    def take_updates(self) -> list[AnchorUpdate]:
        """What changed per anchor since the last call (anchors in a stable order)."""
        keys = sorted(set(self._added) | set(self._removed))
        out = [
            AnchorUpdate(a, False, frozenset(self._added.get(a, ())), frozenset(self._removed.get(a, ()))) for a in keys
        ]
        self._added.clear()
        self._removed.clear()
        return out

    def full(self, anchors: Iterable[int] | None = None, *, clear_pending: bool = True) -> list[AnchorUpdate]:
        """Full updates for ``anchors`` (default: every held anchor); an anchor
        no longer held gives an empty full update, which unregisters it.
        ``clear_pending=False`` when the full set goes to one owner only (a
        resync): the pending changes still have to reach the others."""
        keys = sorted(self._held) if anchors is None else sorted(set(anchors))
        if clear_pending:
            for a in keys:
                self._added.pop(a, None)
                self._removed.pop(a, None)
        return [AnchorUpdate(a, True, frozenset(self._held.get(a, ()))) for a in keys]


# -- messages ------------------------------------------------------------------------


def xor_of(hashes: Iterable[int]) -> int:
    """Order-free checksum of a set of block hashes."""
    out = 0
    for h in hashes:
        out ^= h
    return out


@dataclass(frozen=True, slots=True)
class AnchorCheck:
    """A holder's claim: ``count`` blocks under ``anchor``, whose hashes XOR to ``xor``."""

    anchor: int
    count: int
    xor: int


@dataclass(frozen=True, slots=True)
class Register:
    """Holder -> directory: updates for the anchors this directory owns, plus
    load; ``checks`` (applied after the updates) confirm whole anchors."""

    holder: str
    epoch: int
    load: Load
    updates: tuple[AnchorUpdate, ...]
    checks: tuple[AnchorCheck, ...] = ()


@dataclass(frozen=True, slots=True)
class Resend:
    """Directory -> holder, in reply to a register: send these anchors in full
    (their checks did not match what the directory holds)."""

    anchors: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Query:
    """Entry -> directory: who holds the longest prefix of these blocks?

    ``hashes`` are the request's chained block hashes at depths ``depth``
    (the anchor, ``hashes[0]``), ``depth + stride``, ..., then every depth
    of the last ``tail`` blocks up to ``blocks`` (the request's last full
    block): see :meth:`depths`."""

    anchor: int
    depth: int
    stride: int
    tail: int
    blocks: int
    hashes: tuple[int, ...]
    prompt_tokens: int
    limit: int

    def depths(self) -> list[int]:
        """1-based depth of each hash in ``hashes``."""
        return _sampled_depths(self.depth, self.blocks, self.stride, self.tail)


@dataclass(frozen=True, slots=True)
class AnswerHolder:
    holder: str
    match_blocks: int
    """Blocks of the request's prefix it holds, counted from the first block."""
    load: Load
    age_s: float
    """How old the load report was when the directory answered."""


@dataclass(frozen=True, slots=True)
class Answer:
    anchor: int
    holders: tuple[AnswerHolder, ...]


REFUSAL_CODES = ("BAD_REQUEST", "TOO_LARGE", "NOT_HOLDER", "LIMIT", "INTERNAL")
"""Why a directory node refused a message: malformed or unexpected, over the
size limit, a register naming a holder other than the stream's peer, a
holder over ``max_blocks_per_holder`` (its records are dropped), or its own
failure."""
MAX_REFUSAL_TEXT = 512


@dataclass(frozen=True, slots=True)
class Refusal:
    """Directory -> sender, instead of a reply: the message was refused (``code``
    one of :data:`REFUSAL_CODES`) and nothing of it was applied."""

    code: str
    message: str


Message = Register | Query | Answer | Resend | Refusal


def _pack(hashes: Iterable[int]) -> bytes:
    return b"".join(_U64.pack(h) for h in sorted(hashes))


def _unpack(raw: object, what: str, limit: int, ordered: bool = False) -> tuple[int, ...]:
    if not isinstance(raw, bytes):
        raise DirectoryError(f"{what} must be a byte string")
    if len(raw) % 8:
        raise DirectoryError(f"{what} length {len(raw)} is not a multiple of 8")
    if len(raw) // 8 > limit:
        raise DirectoryError(f"{what} holds more than {limit} hashes")
    values = tuple(h for (h,) in _U64.iter_unpack(raw))
    if not ordered and len(set(values)) != len(values):
        raise DirectoryError(f"{what} repeats a hash")
    return values


LOAD_FIELDS = 7
"""A load in a directory message: ``[queued, ms_per_token, active, slots, free_slots, slot_wait_ms,
speed_measured]``, the fields of the gossiped ``LoadReport`` (docs/protocol.md)."""


def _load_fields(load: Load) -> list[Any]:
    slots = min(max(1, load.slots), MAX_REPORTED_SLOTS)
    return [
        load.queued_prefill_tokens, float(load.prefill_ms_per_token), load.active_requests,
        slots, min(max(0, load.free_slots), slots), float(min(max(0.0, load.slot_wait_ms), MAX_REPORTED_SLOT_WAIT_MS)),
        bool(load.speed_measured),
    ]


def encode_message(msg: Message) -> bytes:
    """CBOR bytes of a directory message (schema ``DIRECTORY_SCHEMA``)."""
    if isinstance(msg, Register):
        doc: dict[str, Any] = {
            "s": DIRECTORY_SCHEMA,
            "t": "reg",
            "n": msg.holder,
            "e": msg.epoch,
            "l": _load_fields(msg.load),
            "u": [[u.anchor, u.full, _pack(u.added), _pack(u.removed)] for u in msg.updates],
            "c": [[c.anchor, c.count, c.xor] for c in msg.checks],
        }
    elif isinstance(msg, Resend):
        doc = {"s": DIRECTORY_SCHEMA, "t": "resend", "a": _pack(msg.anchors)}
    elif isinstance(msg, Query):
        doc = {
            "s": DIRECTORY_SCHEMA,
            "t": "q",
            "a": msg.anchor,
            "d": msg.depth,
            "i": msg.stride,
            "w": msg.tail,
            "b": msg.blocks,
            "h": b"".join(_U64.pack(h) for h in msg.hashes),
            "p": msg.prompt_tokens,
            "k": msg.limit,
        }
    elif isinstance(msg, Answer):
        doc = {
            "s": DIRECTORY_SCHEMA,
            "t": "ans",
            "a": msg.anchor,
            "r": [[h.holder, h.match_blocks, *_load_fields(h.load), round(h.age_s * 1000)] for h in msg.holders],
        }
    elif isinstance(msg, Refusal):
        if msg.code not in REFUSAL_CODES:
            raise ValueError(f"unknown refusal code {msg.code!r}")
        doc = {"s": DIRECTORY_SCHEMA, "t": "err", "c": msg.code, "m": msg.message[:MAX_REFUSAL_TEXT]}
    else:
        raise TypeError(f"not a directory message: {type(msg).__name__}")
    return cbor2.dumps(doc)


def _uint(value: object, what: str, bits: int = 63) -> int:
    if type(value) is not int or not 0 <= value < 1 << bits:
        raise DirectoryError(f"{what} must be an integer in 0..2**{bits}-1")
    return value


def _id(value: object, what: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ID_LEN:
        raise DirectoryError(f"{what} must be a string of 1..{MAX_ID_LEN} characters")
    return value


def _list(value: object, what: str, limit: int) -> list[Any]:
    if not isinstance(value, list):
        raise DirectoryError(f"{what} must be a list")
    if len(value) > limit:
        raise DirectoryError(f"{what} has more than {limit} entries")
    return value


def _load(raw: object, what: str) -> Load:
    fields = _list(raw, what, LOAD_FIELDS)
    if len(fields) != LOAD_FIELDS:
        raise DirectoryError(f"{what} must be [queued, ms_per_token, active, slots, free_slots, slot_wait_ms, speed_measured]")
    queued, ms, active, slots, free, wait, measured = fields
    if not isinstance(ms, float) or not math.isfinite(ms) or ms < 0:
        raise DirectoryError(f"{what}: ms_per_token must be a finite float >= 0")
    if type(slots) is not int or not 1 <= slots <= MAX_REPORTED_SLOTS:
        raise DirectoryError(f"{what}: slots must be an integer in 1..{MAX_REPORTED_SLOTS}")
    if type(free) is not int or not 0 <= free <= slots:
        raise DirectoryError(f"{what}: free_slots must be an integer in 0..slots")
    if not isinstance(wait, float) or not math.isfinite(wait) or not 0 <= wait <= MAX_REPORTED_SLOT_WAIT_MS:
        raise DirectoryError(f"{what}: slot_wait_ms must be a float in 0..{MAX_REPORTED_SLOT_WAIT_MS:g}")
    if not isinstance(measured, bool):
        raise DirectoryError(f"{what}: speed_measured must be a boolean")
    return Load(_uint(queued, f"{what}: queued"), ms, _uint(active, f"{what}: active"), slots, free, wait, measured)


_KEYS = {
    "reg": {"s", "t", "n", "e", "l", "u", "c"},
    "resend": {"s", "t", "a"},
    "q": {"s", "t", "a", "d", "i", "w", "b", "h", "p", "k"},
    "ans": {"s", "t", "a", "r"},
    "err": {"s", "t", "c", "m"},
}


def decode_message(data: bytes) -> Message:
    """Parse and validate one directory message; raises :class:`DirectoryError` only."""
    doc = loads_strict(data, what="directory message", max_bytes=MAX_DIRECTORY_BYTES, max_depth=5, error=DirectoryError)
    if not isinstance(doc, dict):
        raise DirectoryError("a directory message must be a CBOR map")
    if doc.get("s") != DIRECTORY_SCHEMA or type(doc.get("s")) is not int:
        raise DirectoryError(f"unsupported directory schema {doc.get('s')!r} (this node speaks {DIRECTORY_SCHEMA})")
    kind = doc.get("t")
    if not isinstance(kind, str) or kind not in _KEYS:
        raise DirectoryError(f"unknown directory message type {kind!r}")
    if set(doc) != _KEYS[kind]:
        raise DirectoryError(f"a {kind!r} message has exactly the keys {sorted(_KEYS[kind])}")
    if kind == "reg":
        updates = []
        total = 0
        anchors: set[int] = set()
        for i, raw in enumerate(_list(doc["u"], "updates", MAX_REGISTER_ANCHORS)):
            entry = _list(raw, f"update {i}", 4)
            if len(entry) != 4 or not isinstance(entry[1], bool):
                raise DirectoryError(f"update {i} must be [anchor, full, added, removed]")
            anchor = _uint(entry[0], f"update {i} anchor", 64)
            if anchor in anchors:
                raise DirectoryError(f"update {i} repeats anchor {anchor}")
            anchors.add(anchor)
            added = _unpack(entry[2], f"update {i} added", MAX_REGISTER_HASHES)
            removed = _unpack(entry[3], f"update {i} removed", MAX_REGISTER_HASHES)
            if entry[1] and removed:
                raise DirectoryError(f"update {i}: a full update removes nothing")
            if set(added) & set(removed):
                raise DirectoryError(f"update {i} adds and removes the same hash")
            total += len(added) + len(removed)
            if total > MAX_REGISTER_HASHES:
                raise DirectoryError(f"more than {MAX_REGISTER_HASHES} hashes in one register message")
            updates.append(AnchorUpdate(anchor, entry[1], frozenset(added), frozenset(removed)))
        checks = []
        checked: set[int] = set()
        for i, raw in enumerate(_list(doc["c"], "checks", MAX_REGISTER_ANCHORS)):
            entry = _list(raw, f"check {i}", 3)
            if len(entry) != 3:
                raise DirectoryError(f"check {i} must be [anchor, count, xor]")
            check = AnchorCheck(_uint(entry[0], f"check {i} anchor", 64), _uint(entry[1], f"check {i} count"), _uint(entry[2], f"check {i} xor", 64))
            if check.anchor in checked:
                raise DirectoryError(f"check {i} repeats anchor {check.anchor}")
            checked.add(check.anchor)
            checks.append(check)
        return Register(_id(doc["n"], "holder id"), _uint(doc["e"], "epoch"), _load(doc["l"], "load"), tuple(updates), tuple(checks))
    if kind == "err":
        code, text = doc["c"], doc["m"]
        if not isinstance(code, str) or code not in REFUSAL_CODES:
            raise DirectoryError(f"unknown refusal code {code!r}")
        if not isinstance(text, str) or len(text) > MAX_REFUSAL_TEXT:
            raise DirectoryError(f"a refusal's message must be a string of at most {MAX_REFUSAL_TEXT} characters")
        return Refusal(code, text)
    if kind == "resend":
        return Resend(tuple(sorted(_unpack(doc["a"], "anchors", MAX_REGISTER_ANCHORS))))
    if kind == "q":
        anchor = _uint(doc["a"], "anchor", 64)
        hashes = _unpack(doc["h"], "query hashes", MAX_QUERY_BLOCKS, ordered=True)
        if not hashes or hashes[0] != anchor:
            raise DirectoryError("query hashes must start with the anchor")
        depth, stride, blocks = _uint(doc["d"], "depth"), _uint(doc["i"], "stride"), _uint(doc["b"], "blocks")
        tail = _uint(doc["w"], "tail")
        if not 1 <= depth <= blocks or stride < 1 or tail < 1:
            raise DirectoryError("need 1 <= depth <= blocks, stride >= 1 and tail >= 1")
        if _sampled_count(depth, blocks, stride, tail) != len(hashes):
            raise DirectoryError("query hashes do not match its depth, stride, tail and blocks")
        limit = _uint(doc["k"], "limit")
        if not 1 <= limit <= MAX_ANSWER_HOLDERS:
            raise DirectoryError(f"limit must be in 1..{MAX_ANSWER_HOLDERS}")
        return Query(anchor, depth, stride, tail, blocks, hashes, _uint(doc["p"], "prompt tokens"), limit)
    holders = []
    for i, raw in enumerate(_list(doc["r"], "holders", MAX_ANSWER_HOLDERS)):
        entry = _list(raw, f"holder {i}", 3 + LOAD_FIELDS)
        if len(entry) != 3 + LOAD_FIELDS:
            raise DirectoryError(f"holder {i} must be [id, match_blocks, <the {LOAD_FIELDS} load fields>, age_ms]")
        load = _load(entry[2 : 2 + LOAD_FIELDS], f"holder {i} load")
        age = _uint(entry[2 + LOAD_FIELDS], f"holder {i} age") / 1000.0
        holders.append(AnswerHolder(_id(entry[0], f"holder {i} id"), _uint(entry[1], f"holder {i} match"), load, age))
    return Answer(_uint(doc["a"], "anchor", 64), tuple(holders))


# -- the directory side ---------------------------------------------------------------


@dataclass(slots=True)
class _Record:
    epoch: int
    hashes: set[int]
    seen_at: float


@dataclass(slots=True)
class _Holder:
    epoch: int
    load: Load
    load_at: float


class DirectoryStore:
    """What one directory node knows: for each anchor it owns, who holds
    which blocks under it, and each holder's last reported load."""

    def __init__(self, block_size: int = 16, *, max_blocks_per_holder: int = 1 << 16, max_holders: int = 4096) -> None:
        self.block_size = block_size
        self.max_blocks_per_holder = max_blocks_per_holder
        self.max_holders = max_holders
        self._records: dict[int, dict[str, _Record]] = {}
        self._index: dict[int, dict[int, dict[str, None]]] = {}
        """anchor -> block hash -> holders (dicts: deterministic order)."""
        self._holders: dict[str, _Holder] = {}
        self._blocks: dict[str, int] = {}
        """Blocks each holder has registered here, over all anchors."""
        self.refused_over_limit = 0
        self.holders_evicted = 0

    def anchors(self) -> list[int]:
        return list(self._records)

    def holders(self, anchor: int) -> dict[str, frozenset[int]]:
        return {h: frozenset(r.hashes) for h, r in self._records.get(anchor, {}).items()}

    def __len__(self) -> int:
        """Block registrations held (a memory measure)."""
        return sum(len(r.hashes) for recs in self._records.values() for r in recs.values())

    def _drop(self, anchor: int, holder: str) -> None:
        recs = self._records.get(anchor)
        if recs is None or holder not in recs:
            return
        rec = recs.pop(holder)
        self._blocks[holder] = self._blocks.get(holder, 0) - len(rec.hashes)
        index = self._index[anchor]
        for h in rec.hashes:
            hs = index.get(h)
            if hs is not None:
                hs.pop(holder, None)
                if not hs:
                    del index[h]
        if not recs:
            del self._records[anchor]
            del self._index[anchor]

    def apply(self, msg: Register, now: float) -> list[int]:
        """Fold one register message in (a newer epoch replaces the holder's
        records); returns the checked anchors that do not match, to be resent."""
        holder = msg.holder
        known = self._holders.get(holder)
        if known is not None and known.epoch != msg.epoch:
            self.drop_holder(holder)
        if holder not in self._holders and len(self._holders) >= self.max_holders:
            oldest = min(self._holders, key=lambda h: self._holders[h].load_at)
            self.drop_holder(oldest)
            self.holders_evicted += 1
        self._holders[holder] = _Holder(msg.epoch, msg.load, now)
        for u in msg.updates:
            recs = self._records.setdefault(u.anchor, {})
            index = self._index.setdefault(u.anchor, {})
            rec = recs.get(holder)
            if rec is None:
                rec = recs[holder] = _Record(msg.epoch, set(), now)
            rec.seen_at = now
            if u.full:
                gone = rec.hashes - u.added
                new = u.added - rec.hashes
            else:
                gone = u.removed & rec.hashes
                new = u.added - rec.hashes
            for h in gone:
                hs = index.get(h)
                if hs is not None:
                    hs.pop(holder, None)
                    if not hs:
                        del index[h]
            for h in sorted(new):
                index.setdefault(h, {})[holder] = None
            rec.hashes -= gone
            rec.hashes |= new
            self._blocks[holder] = self._blocks.get(holder, 0) + len(new) - len(gone)
            if not rec.hashes:
                self._drop(u.anchor, holder)
        if self._blocks.get(holder, 0) > self.max_blocks_per_holder:
            count = self._blocks[holder]
            self.drop_holder(holder)
            self.refused_over_limit += 1
            raise DirectoryLimit(f"holder {holder} registered {count} blocks here, the limit is "
                                 f"{self.max_blocks_per_holder}: its records are dropped")
        resend = []
        for c in msg.checks:
            rec = self._records.get(c.anchor, {}).get(holder)
            if rec is not None and len(rec.hashes) == c.count and xor_of(rec.hashes) == c.xor:
                rec.seen_at = now
            else:
                resend.append(c.anchor)
        return resend

    def holder_info(self, holder: str) -> tuple[int, Load] | None:
        """``(epoch, last load)`` of a holder this directory has heard from."""
        info = self._holders.get(holder)
        return None if info is None else (info.epoch, info.load)

    def drop_holder(self, holder: str) -> None:
        """Forget everything ``holder`` registered (it left, or restarted)."""
        for anchor in [a for a, recs in self._records.items() if holder in recs]:
            self._drop(anchor, holder)
        self._holders.pop(holder, None)
        self._blocks.pop(holder, None)

    def drop_anchor(self, anchor: int) -> None:
        """Forget an anchor (this node no longer owns it)."""
        for holder in list(self._records.get(anchor, {})):
            self._drop(anchor, holder)

    def expire(self, now: float, ttl: float) -> int:
        """Drop records not refreshed for ``ttl`` seconds; returns how many."""
        stale = [(a, h) for a, recs in self._records.items() for h, r in recs.items() if now - r.seen_at > ttl]
        for a, h in stale:
            self._drop(a, h)
        live = {h for recs in self._records.values() for h in recs}
        for h in [h for h in self._holders if h not in live]:
            del self._holders[h]
            self._blocks.pop(h, None)
        return len(stale)

    def answer(self, query: Query, now: float, exclude: str = "") -> Answer:
        """The ``query.limit`` holders that look cheapest for this request.

        A holder's match is the deepest query block it registered (chained
        hashes: holding block *i* means holding 0..i); with a query stride
        above 1 that understates it by fewer than ``stride`` blocks. Holders are ranked by
        the same terms ``TtftEstimator`` uses, without the RTT the directory
        cannot know: the reported wait (:meth:`Load.wait_ms`: queued prefill or
        the wait for a free slot, both drained since the report, as
        ``TtftEstimator.drain_reported_queue`` does) plus the uncached prefill.
        Cost: O(query blocks + holders of the anchor).
        """
        index = self._index.get(query.anchor)
        if not index:
            return Answer(query.anchor, ())
        matched: dict[str, int] = {}
        depths = query.depths()
        for j in range(len(query.hashes) - 1, -1, -1):
            hs = index.get(query.hashes[j])
            if hs:
                for h in hs:
                    if h not in matched and h != exclude:
                        matched[h] = depths[j]
        scored = []
        for h, blocks in matched.items():
            info = self._holders[h]
            load, age = info.load, max(0.0, now - info.load_at)
            ms = load.prefill_ms_per_token
            drained = load
            if ms > 0:
                drained = replace(
                    load,
                    queued_prefill_tokens=max(0, load.queued_prefill_tokens - int(age * 1000.0 / ms)),
                    slot_wait_ms=max(0.0, load.slot_wait_ms - age * 1000.0),
                )
            uncached = max(1, query.prompt_tokens - blocks * self.block_size)
            scored.append((drained.wait_ms() + uncached * ms, h, blocks, load, age))
        scored.sort(key=lambda t: (t[0], t[1]))
        return Answer(
            query.anchor, tuple(AnswerHolder(h, blocks, load, age) for _, h, blocks, load, age in scored[: query.limit])
        )


# -- the entry side -------------------------------------------------------------------


def apply_answer(view: PeerView, answer: Answer, now: float, fingerprint: str) -> None:
    """Fold an answer's loads into the entry's peer view (never over a fresher
    report), so that busy backoffs, trust and RTTs apply to answered holders
    as to any peer. Their cache match lives in :class:`DirectoryView`."""
    for h in answer.holders:
        if h.holder == view.self_id:
            continue
        at = now - h.age_s
        state = view.get(h.holder)
        if state is None or state.load_at is None or state.load_at < at:
            view.update_load(h.holder, h.load, at)
            state = view.get(h.holder)
        assert state is not None
        state.last_seen = max(state.last_seen, now)
        if not state.fingerprint:
            # The anchor is a chained hash seeded with the model fingerprint:
            # a holder registered under it runs this model.
            state.fingerprint = fingerprint


def vouched_by(view: PeerView, answer: Answer, block_hashes: Sequence[int], owner: str) -> tuple[tuple[str, str], ...]:
    """``(holder, owner)`` for each holder whose match in a decision comes from
    ``owner``'s answer: more blocks than the entry's own view (its digests)
    gives it. A forward to such a holder that reuses less than predicted is
    evidence against the owner as well as the holder (an owner can name an
    honest peer with blocks it never registered); judged by
    :meth:`~p2pinfer.core.attempts.RequestAttempts` like a digest's claim.
    An answer from this node's own store vouches for nothing beyond what the
    holders registered."""
    if owner == view.self_id:
        return ()
    own = view.longest_matches(block_hashes)
    return tuple(
        (h.holder, owner)
        for h in answer.holders
        if h.holder not in (view.self_id, owner) and min(h.match_blocks, len(block_hashes)) > own.get(h.holder, 0)
    )


def askable_owners(owners: Sequence[str], self_id: str, distrusted: Callable[[str], bool]) -> list[str]:
    """An anchor's owners an entry may ask: not one it distrusts (a lying
    owner's answers cost a forward each; without it the entry asks the next
    replica, or decides with what it knows)."""
    return [o for o in owners if o == self_id or not distrusted(o)]


class DirectoryView:
    """The entry's :class:`PeerView` plus one directory answer, shaped like the
    parts of a view a policy reads, so ``CostPolicy`` runs unchanged."""

    def __init__(self, view: PeerView, answer: Answer | None, block_size: int) -> None:
        self.view = view
        self.fingerprint = view.fingerprint
        self.self_id = view.self_id
        self._matches = {} if answer is None else {h.holder: h.match_blocks for h in answer.holders if h.holder != view.self_id}
        self.block_size = block_size

    def longest_matches(self, block_hashes: Sequence[int]) -> dict[str, int]:
        out = self.view.longest_matches(block_hashes)
        for peer, blocks in self._matches.items():
            if peer in self.view and blocks > out.get(peer, 0):
                out[peer] = min(blocks, len(block_hashes))
        return out

    def get(self, peer_id: str) -> PeerState | None:
        return self.view.get(peer_id)

    def eligible(self, state: PeerState, now: float) -> bool:
        return self.view.eligible(state, now)

    def cheapest_peers(self, k: int, now: float, exclude: Any = frozenset()) -> list[PeerState]:
        return self.view.cheapest_peers(k, now, exclude=exclude)

    def __contains__(self, peer_id: object) -> bool:
        return peer_id in self.view

    def __iter__(self) -> Iterator[PeerState]:
        return iter(self.view)

    def __len__(self) -> int:
        return len(self.view)
