"""A wake-up call for a background loop that would otherwise poll.

An idle node should sleep until something happens, not wake up twenty
times a second to check (issue 14: polls were most of an idle node's CPU
once its messages were few). :class:`Wakeup` is a ``trio.Event`` that any
thread may set, as often as it likes, at the cost of one
``run_sync_soon`` per wake-up actually delivered.
"""

from __future__ import annotations

import trio

__all__ = ["Wakeup"]


class Wakeup:
    def __init__(self) -> None:
        self._event = trio.Event()
        self._armed = False
        self._token: trio.lowlevel.TrioToken | None = None

    def bind(self) -> None:
        """Call from the trio thread that will :meth:`wait`, before anyone calls :meth:`set`."""
        self._token = trio.lowlevel.current_trio_token()

    def set(self) -> None:
        """Wake the waiter (from any thread; cheap when it is already woken)."""
        if self._armed or self._token is None:
            return
        self._armed = True
        try:
            self._token.run_sync_soon(self._event.set)
        except trio.RunFinishedError:
            pass

    async def wait(self, timeout_s: float) -> bool:
        """Until :meth:`set` or ``timeout_s``; True when woken. Re-arms for the next call."""
        with trio.move_on_after(max(0.0, timeout_s)):
            await self._event.wait()
        woken = self._event.is_set()
        self._event = trio.Event()
        self._armed = False
        return woken
