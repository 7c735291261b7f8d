"""``/p2pinfer/check/1.0.0``: a third peer scores a forwarded answer.

A spot check (:mod:`p2pinfer.core.verify`) is a prefill of prompt + answer:
cheap on a node whose cache holds the prompt's prefix, a full prefill
elsewhere. So an origin whose own cache lacks the prefix asks a peer that
has it (:func:`~p2pinfer.core.verify.pick_verifier`) for the scores, and
judges them itself. The verifier only scores; it never sees which peer
answered, and its scores are checked for shape here (one per answer
token, of that token, a real distribution's values) before they are judged.

:class:`CheckService` is both sides: :meth:`CheckService.handle` scores a
peer's request on this node's engine (as background work: the engine's
checks yield to requests, and hold a slot in the load it reports), and
:meth:`CheckService.ask` asks a peer. A node refuses (BUSY) while it is
over its valve, while ``max_in_flight`` checks of peers run, while the
asking peer already has ``max_in_flight_per_peer`` of them (so one peer
cannot hold every place and push honest origins to check locally), and for
a peer it distrusts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
import logging
from typing import Any

import trio

from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from ..engines.base import Engine, EngineError, InvalidRequestError, PromptTooLongError
from .counters import NodeCounters
from .framing import FrameError, FrameReader, finish_stream, write_frame
from .wire import (
    CHECK_REQUEST_MAX_BYTES,
    CHECK_RESPONSE_MAX_BYTES,
    CheckScores,
    WireError,
    decode_check_request,
    decode_check_response,
    encode_check_error,
    encode_check_request,
    encode_check_response,
)

__all__ = ["CHECK_PROTOCOL", "CheckService", "CheckUnavailable"]

CHECK_PROTOCOL = TProtocol("/p2pinfer/check/1.0.0")
log = logging.getLogger(__name__)


class CheckUnavailable(Exception):
    """The verifier could not be asked or did not answer in time (not its fault, as far as we know)."""


class CheckService:
    def __init__(
        self,
        *,
        host: IHost,
        engine: Engine,
        fingerprint: str,
        counters: NodeCounters,
        is_busy: Callable[[], bool],
        distrusted: Callable[[str], bool],
        connect: Callable[[str, float], Awaitable[Any]] | None = None,
        timeout_s: float = 120.0,
        max_in_flight: int = 2,
        max_in_flight_per_peer: int = 1,
    ) -> None:
        self.host = host
        self.engine = engine
        self.fingerprint = fingerprint
        self.counters = counters
        self._is_busy = is_busy
        self._distrusted = distrusted
        self._connect = connect
        self._timeout_s = timeout_s
        self.max_in_flight = max_in_flight
        self.max_in_flight_per_peer = max_in_flight_per_peer
        self._in_flight_by_peer: Counter[str] = Counter()

    @property
    def in_flight(self) -> int:
        """Checks of peers being scored now."""
        return sum(self._in_flight_by_peer.values())

    # -- serving ------------------------------------------------------------------
    async def handle(self, stream: INetStream) -> None:
        peer = stream.muxed_conn.peer_id.to_base58()
        ok = False
        try:
            with trio.fail_after(self._timeout_s):
                data = await FrameReader(stream).read_frame(CHECK_REQUEST_MAX_BYTES)
                if data is None:
                    return
                answer = await self._answer(peer, data)
                await write_frame(stream, answer)
                ok = True
        except (FrameError, trio.TooSlowError) as exc:
            self.counters.frames_rejected += 1
            log.debug("check request from %s failed: %s", peer, exc)
        finally:
            await finish_stream(stream, ok)

    def _refuse(self, code: str, message: str) -> bytes:
        self.counters.checks_refused[code] += 1
        return encode_check_error(code, message)

    async def _answer(self, peer: str, data: bytes) -> bytes:
        try:
            query = decode_check_request(data, fingerprint=self.fingerprint, vocab_size=self.engine.vocab_size)
        except WireError as exc:
            if exc.code == "BAD_REQUEST":
                self.counters.frames_rejected += 1
            return self._refuse(exc.code, exc.message)
        if self._distrusted(peer):
            return self._refuse("BUSY", "this node distrusts the asking peer")
        if not self.engine.can_score:
            return self._refuse("BAD_REQUEST", f"the {self.engine.name} engine cannot score tokens")
        if self.in_flight >= self.max_in_flight or self._is_busy():
            return self._refuse("BUSY", f"{self.in_flight} checks of peers running (limit {self.max_in_flight}), or over the busy valve")
        if self._in_flight_by_peer[peer] >= self.max_in_flight_per_peer:
            return self._refuse("BUSY", f"{self.max_in_flight_per_peer} check(s) of this peer already running (the limit per peer)")
        tokens = query.prompt + query.answer
        evaluated = len(query.prompt) - self.engine.cache.match(query.prompt, touch=False) + len(query.answer)
        self._in_flight_by_peer[peer] += 1
        try:
            scores = await self.engine.score(tokens, len(query.prompt), temperature=query.temperature)
        except PromptTooLongError as exc:
            return self._refuse("TOO_LARGE", str(exc))
        except InvalidRequestError as exc:
            return self._refuse("BAD_REQUEST", str(exc))
        except (EngineError, NotImplementedError) as exc:
            return self._refuse("INTERNAL", f"scoring failed: {exc}")
        finally:
            self._in_flight_by_peer[peer] -= 1
            if not self._in_flight_by_peer[peer]:
                del self._in_flight_by_peer[peer]
        self.counters.checks_served += 1
        self.counters.check_tokens_served += evaluated
        return encode_check_response(scores, evaluated)

    # -- asking ---------------------------------------------------------------------
    async def ask(
        self, peer: str, prompt: Sequence[int], answer: Sequence[int], temperature: float, *, deadline: float
    ) -> CheckScores:
        """``peer``'s scores of ``answer`` after ``prompt``.

        Raises :class:`CheckUnavailable` when it could not be reached or did not
        answer by ``deadline`` (trio clock), :class:`~p2pinfer.net.wire.RemoteError`
        when it refused, and :class:`~p2pinfer.net.wire.WireError` when its
        answer cannot be real scores of ``answer`` (the verifier's fault).
        """
        stream: INetStream | None = None
        ok = False
        try:
            with trio.move_on_at(deadline) as scope:
                try:
                    if self._connect is not None:
                        await self._connect(peer, deadline)
                    stream = await self.host.new_stream(ID.from_base58(peer), [CHECK_PROTOCOL])
                    await write_frame(stream, encode_check_request(self.fingerprint, prompt, answer, temperature))
                    data = await FrameReader(stream).read_frame(CHECK_RESPONSE_MAX_BYTES)
                except FrameError as exc:
                    raise WireError("BAD_REQUEST", f"bad check answer frame: {exc}") from None
                except (WireError, trio.Cancelled):
                    raise
                except Exception as exc:  # dial errors, resets: the peer may be gone
                    raise CheckUnavailable(f"cannot ask {peer}: {type(exc).__name__}: {exc}") from None
            if scope.cancelled_caught:
                raise CheckUnavailable(f"{peer} did not answer the check in time")
            if data is None:
                raise CheckUnavailable(f"{peer} closed the check stream without an answer")
            ok = True
            return decode_check_response(data, answer, peer=peer)
        finally:
            if stream is not None:
                await finish_stream(stream, ok)
