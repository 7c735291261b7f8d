"""Turning a stream of token pieces into text, with stop strings.

A token may end in the middle of a UTF-8 character, and a stop string may
span several tokens, so text is released only once it is known to be final:
incomplete characters and any tail that could still grow into a stop string
are held back.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence

__all__ = ["TextStream"]


class TextStream:
    def __init__(self, stop: Sequence[str] = ()) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._stop = tuple(s for s in stop if s)
        self._held = ""
        self.stopped = False

    def feed(self, piece: bytes) -> str:
        """Text that is now final; sets :attr:`stopped` when a stop string appears."""
        if self.stopped:
            return ""
        self._held += self._decoder.decode(piece)
        if not self._stop:
            out, self._held = self._held, ""
            return out
        cut = min((i for i in (self._held.find(s) for s in self._stop) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            out, self._held = self._held[:cut], ""
            return out
        keep = 0
        for s in self._stop:
            for k in range(min(len(s) - 1, len(self._held)), keep, -1):
                if self._held.endswith(s[:k]):
                    keep = k
                    break
        out = self._held[: len(self._held) - keep]
        self._held = self._held[len(out) :]
        return out

    def flush(self) -> str:
        """Whatever is still held, at the end of the generation."""
        if self.stopped:
            return ""
        out = self._held + self._decoder.decode(b"", final=True)
        self._held = ""
        return out
