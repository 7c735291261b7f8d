"""Runtime patches of py-libp2p 0.8.1, each small, each for a measured cost.

Applied once by :func:`apply` (from :func:`p2pinfer.net.host.build_stack`),
only to the version they were written against: on any other py-libp2p
version they are skipped with a warning, and the node runs py-libp2p as it
is. Remove a patch when py-libp2p fixes what it works around.

**Yamux window updates once per half window** (``YamuxStream._auto_tune_and_send_window_update``).
py-libp2p 0.8.1 sends a WINDOW_UPDATE frame after *every* read of a yamux
stream: its "partial slack" and "release on read" branches credit any
positive amount (``PY_YAMUX_RELEASE_ON_READ=0`` does not stop the first).
Pubsub reads each RPC's length prefix a byte at a time and then its body, so
each gossip RPC received cost two or three window updates back: one Noise
frame and one socket write each, and as many reads at the other end. In an
idle swarm of 8 nodes that was 13 % of a node's CPU (py-spy) and the larger
part of its TCP packets. The replacement keeps go-yamux's rule (its
``sendWindowUpdate``): credit the peer once the bytes read since the last
update reach half the target window (128 KiB at first), growing the window
as py-libp2p's auto-tuning does. A sender is never stalled by it: it keeps at
least half a window of credit while the reader keeps reading, and a reader
that stops reading stops crediting, which is yamux's back-pressure.

**The signed peer record built once a second, not once per RPC**
(``env_to_send_in_RPC`` as pubsub and gossipsub call it). py-libp2p 0.8.1
asks for its signed peer record before every RPC it sends: each call lists
the host's addresses (``host.get_addrs()``, multiaddr parsing) to compare
them with the cached record's. At 16 idle nodes that was about 6 % of a
node's busy samples (py-spy: ``env_to_send_in_RPC``, ``BasicHost.get_addrs``,
``Multiaddr._from_string``), for a record that ``CountingPubsub.write_msg``
then strips from all but a stream's first RPC. The replacement answers from
a per-host copy at most one second old; a changed address reaches the record
within that second.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
import logging
import time
from typing import Any
import weakref

__all__ = ["PATCHED_FOR", "apply", "applied"]

log = logging.getLogger(__name__)

PATCHED_FOR = "0.8.1"
"""The py-libp2p version these patches were written against and tested with."""

_applied: list[str] = []


def applied() -> list[str]:
    """Names of the patches in force in this process."""
    return list(_applied)


async def _window_update_on_half_window(self: Any, *, bytes_read: int = 0) -> None:
    """go-yamux's rule: credit the peer once half the target window has been read."""
    total_delta = 0
    async with self.window_lock:
        buffered = len(self.conn.stream_buffers.get(self.stream_id, b""))
        consumed = self.target_recv_window - (self.recv_window + buffered)
        if consumed > 0 and consumed >= self._grow_threshold():
            total_delta = self._grow_to_delta(buffered)
            total_delta += self._apply_autotune_epoch(buffered)
            self._pending_recv_release = 0
    if total_delta > 0:
        await self.send_window_update(total_delta, skip_lock=True)


def _patch_yamux_window_updates() -> bool:
    from libp2p.stream_muxer.yamux.yamux import YamuxStream

    needed = ("_auto_tune_and_send_window_update", "_grow_threshold", "_grow_to_delta", "_apply_autotune_epoch",
              "send_window_update")
    if not all(hasattr(YamuxStream, name) for name in needed):
        log.warning("py-libp2p's YamuxStream changed: yamux window-update patch not applied")
        return False
    YamuxStream._original_auto_tune_and_send_window_update = YamuxStream._auto_tune_and_send_window_update
    YamuxStream._auto_tune_and_send_window_update = _window_update_on_half_window
    return True


ENVELOPE_TTL_S = 1.0
"""How old the signed peer record that pubsub sends may be."""


def _patch_envelope_per_rpc() -> bool:
    import libp2p.pubsub.gossipsub as gossipsub_mod
    import libp2p.pubsub.pubsub as pubsub_mod
    from libp2p.peer import peerstore

    original = getattr(peerstore, "env_to_send_in_RPC", None)
    if original is None or any(getattr(m, "env_to_send_in_RPC", None) is not original for m in (pubsub_mod, gossipsub_mod)):
        log.warning("py-libp2p's pubsub changed: signed-record patch not applied")
        return False
    copies: weakref.WeakKeyDictionary[Any, tuple[float, bytes]] = weakref.WeakKeyDictionary()

    def env_to_send_in_rpc_cached(host: Any) -> tuple[bytes, bool]:
        now = time.monotonic()
        held = copies.get(host)
        if held is not None and now - held[0] < ENVELOPE_TTL_S:
            return held[1], False
        envelope, created = original(host)
        copies[host] = (now, envelope)
        return envelope, created

    env_to_send_in_rpc_cached.original = original  # type: ignore[attr-defined]
    pubsub_mod.env_to_send_in_RPC = env_to_send_in_rpc_cached
    gossipsub_mod.env_to_send_in_RPC = env_to_send_in_rpc_cached
    return True


def apply() -> list[str]:
    """Apply every patch once (idempotent); returns the names in force."""
    if _applied:
        return applied()
    try:
        have = version("libp2p")
    except PackageNotFoundError:  # pragma: no cover - libp2p is a dependency
        return []
    if have != PATCHED_FOR:
        log.warning("py-libp2p %s, not %s: runtime patches (p2pinfer.net.libp2p_patches) skipped", have, PATCHED_FOR)
        _applied.append("none (py-libp2p version differs)")
        return applied()
    if _patch_yamux_window_updates():
        _applied.append("yamux window update per half window")
    if _patch_envelope_per_rpc():
        _applied.append("signed peer record once a second")
    return applied()
