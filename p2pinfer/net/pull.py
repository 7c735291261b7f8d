"""``/p2pinfer/digest-pull/1.0.0``: fetch a peer's full digest on demand.

A node that meets a peer (new connection), or learns that its copy of a
peer's digest fell behind (a delta gap, a load report with a newer version
or a new epoch), pulls the peer's own full digest over a stream instead of
waiting up to ``full_interval_s`` for the next broadcast. The answer also
lists peers the responder knows (peer exchange), so a node that joined
through one bootstrap peer meets the rest of the swarm at once.

Only the responder's *own* digest is accepted (it is the stream's
authenticated peer); what it says about others is limited to addresses.
A pull is the first thing a node does with a peer it meets, so this is
also where a peer of another model is found out (MODEL_MISMATCH, either
way round). Peers we distrust are not pulled.
"""

from __future__ import annotations

from collections.abc import Callable
import logging
import time
from typing import Any

import trio

from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from ..core.router import Router
from .counters import NodeCounters
from .framing import FrameError, FrameReader, finish_stream, write_frame
from .gossip import GossipService
from .other_models import OtherModels
from .sanctions import PeerSanctions
from .wire import (
    PULL_REQUEST_MAX_BYTES,
    PULL_RESPONSE_MAX_BYTES,
    GossipRejected,
    RemoteError,
    WireError,
    decode_pull_request,
    decode_pull_response,
    encode_pull_error,
    encode_pull_request,
    encode_pull_response,
    fingerprint_in_message,
    mismatch_message,
)

__all__ = ["PULL_PROTOCOL", "DigestPuller"]

PULL_PROTOCOL = TProtocol("/p2pinfer/digest-pull/1.0.0")
log = logging.getLogger(__name__)

_MIN_SPACING_S = 1.0
"""At most one pull per peer per second, whatever triggers it."""
_MAX_PEERS_LISTED = 32


def _newer_target(queued: tuple[int, int], wanted: tuple[int, int]) -> tuple[int, int]:
    """The (epoch, version) a queued pull must reach once ``wanted`` is asked for too."""
    if queued[0] < 0 or wanted[0] < 0:
        return (-1, 0)  # an unconditional pull covers any check
    if queued[0] != wanted[0]:
        return wanted  # a newer epoch (a restart) replaces the old target
    return (queued[0], max(queued[1], wanted[1]))


class DigestPuller:
    def __init__(
        self,
        *,
        host: IHost,
        router: Router,
        gossip: GossipService,
        counters: NodeCounters,
        known_peers: Callable[[int], list[tuple[str, list[str]]]],
        learn: Callable[[str, tuple[str, ...]], None],
        timeout_s: float,
        sanctions: PeerSanctions | None = None,
        other_models: OtherModels | None = None,
    ) -> None:
        self.host = host
        self._sanctions = sanctions
        self._other_models = other_models
        self.router = router
        self.gossip = gossip
        self.counters = counters
        self._known_peers = known_peers
        self._learn = learn
        self._timeout_s = timeout_s
        self._send, self._recv = trio.open_memory_channel[tuple[str, float]](1024)
        self._queued: dict[str, tuple[int, int]] = {}
        """Peers waiting for a pull, each with the (epoch, version) it must reach (epoch -1: pull anyway)."""
        self._last_pull: dict[str, float] = {}

    # -- serving ------------------------------------------------------------------
    async def handle(self, stream: INetStream) -> None:
        ok = False
        try:
            with trio.fail_after(self._timeout_s):
                data = await FrameReader(stream).read_frame(PULL_REQUEST_MAX_BYTES)
                if data is None:
                    return
                try:
                    req = decode_pull_request(data)
                except WireError as exc:
                    self.counters.frames_rejected += 1
                    await write_frame(stream, encode_pull_error(exc.code, exc.message))
                    ok = True
                    return
                if req.model_fingerprint != self.router.fingerprint_hex:
                    if self._other_models is not None:
                        peer = stream.muxed_conn.peer_id.to_base58()
                        self._other_models.note(peer, req.model_fingerprint, "a digest pull request")
                    msg = mismatch_message(self.router.fingerprint_hex)
                    await write_frame(stream, encode_pull_error("MODEL_MISMATCH", msg))
                    ok = True
                    return
                # Publish pending changes first, so the full digest we hand
                # out has the version everyone else is about to hold.
                await self.gossip.flush_delta()
                full = self.router.full_digest()
                peers = self._known_peers(min(req.max_peers, _MAX_PEERS_LISTED))
                await write_frame(stream, encode_pull_response(full, self.gossip.load_report(), peers))
                self.counters.pulls_served += 1
                ok = True
        except (FrameError, trio.TooSlowError) as exc:
            self.counters.frames_rejected += 1
            log.debug("digest pull from %s failed: %s", stream.muxed_conn.peer_id, exc)
        finally:
            await finish_stream(stream, ok)

    # -- pulling ----------------------------------------------------------------------
    def want(self, peer_id: str, epoch: int = -1, version: int = 0, delay_s: float = 0.0) -> None:
        """Ask for a pull of ``peer_id`` (deduplicated, never blocks).

        With ``epoch``/``version`` the pull happens only if our copy is still
        older after ``delay_s`` (the delta may simply be in flight).
        """
        queued = self._queued.get(peer_id)
        if queued is not None:
            # One pull per peer in the queue, but it must answer the newest
            # reason: a gap at v5 reported while a check for v0 waits would
            # otherwise be dropped, and the v0 check finds nothing to pull.
            self._queued[peer_id] = _newer_target(queued, (epoch, version))
            return
        try:
            self._send.send_nowait((peer_id, time.monotonic() + delay_s))
        except trio.WouldBlock:
            return
        self._queued[peer_id] = (epoch, version)

    def _still_behind(self, peer_id: str, epoch: int, version: int) -> bool:
        if epoch < 0:
            return True
        state = self.router.view.get(peer_id)
        return state is None or state.epoch != epoch or state.version < version

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        limiter = trio.CapacityLimiter(4)
        async with trio.open_nursery() as nursery:
            task_status.started()
            async for peer_id, due in self._recv:
                nursery.start_soon(self._pull_when_due, limiter, peer_id, due)

    async def _pull_when_due(self, limiter: trio.CapacityLimiter, peer_id: str, due: float) -> None:
        try:
            earliest = max(due, self._last_pull.get(peer_id, 0.0) + _MIN_SPACING_S)
            await trio.sleep(max(0.0, earliest - time.monotonic()))
            epoch, version = self._queued.get(peer_id, (-1, 0))
            if not self._still_behind(peer_id, epoch, version):
                return
            if self._sanctions is not None and self._sanctions.is_distrusted(peer_id):
                return
            async with limiter:
                self._last_pull[peer_id] = time.monotonic()
                await self.pull(peer_id)
        finally:
            self._queued.pop(peer_id, None)

    async def pull(self, peer_id: str) -> bool:
        """Fetch and apply ``peer_id``'s full digest; False when that failed."""
        stream: INetStream | None = None
        ok = False
        try:
            with trio.fail_after(self._timeout_s):
                stream = await self.host.new_stream(ID.from_base58(peer_id), [PULL_PROTOCOL])
                await write_frame(stream, encode_pull_request(self.router.fingerprint_hex, _MAX_PEERS_LISTED))
                data = await FrameReader(stream).read_frame(PULL_RESPONSE_MAX_BYTES)
            if data is None:
                raise FrameError("peer closed the stream without an answer")
            ok = True
            result = decode_pull_response(data, sender=peer_id, fingerprint=self.router.fingerprint_hex)
        except RemoteError as exc:
            self.counters.pulls_failed += 1
            if exc.code == "MODEL_MISMATCH" and self._other_models is not None:
                self._other_models.note(peer_id, fingerprint_in_message(exc.message), "its answer to a digest pull")
                self.router.on_peer_gone(peer_id)
            else:
                log.info("digest pull from %s refused: %s", peer_id, exc)
            return False
        except GossipRejected as exc:
            self.counters.pulls_failed += 1
            self.counters.gossip_rejected[exc.reason] += 1
            if exc.fingerprint is not None and self._other_models is not None:
                self._other_models.note(peer_id, exc.fingerprint, "the digest it answered a pull with")
                self.router.on_peer_gone(peer_id)
            log.info("digest pull from %s gave a bad answer: %s", peer_id, exc)
            return False
        except Exception as exc:  # dial errors, resets, timeouts: the peer may be gone
            self.counters.pulls_failed += 1
            log.debug("digest pull from %s failed: %s: %s", peer_id, type(exc).__name__, exc)
            return False
        finally:
            if stream is not None:
                await finish_stream(stream, ok)
        if self._other_models is not None:
            self._other_models.cleared(peer_id)
        now = time.monotonic()
        applied = self.router.on_digest(result.digest, now)
        if result.load is not None:
            self.router.on_load(peer_id, result.load.load, result.load.busy, now)
            self._learn(peer_id, result.load.addrs)
        for other, addrs in result.peers:
            self._learn(other, addrs)
        self.counters.pulls_done += 1
        log.debug("pulled digest of %s v%d: %s", peer_id, result.digest.version, applied)
        return True

