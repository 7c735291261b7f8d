"""Turning a stream of token pieces into text, with stop strings.

A token may end in the middle of a UTF-8 character, and a stop string may
span several tokens, so text is released only once it is known to be final:
incomplete characters and any tail that could still grow into a stop string
are held back.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Sequence

__all__ = ["AnswerText", "TextStream"]


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


class AnswerText:
    """The client's text of one answer, rendered from its token ids over every try.

    An answer that moves to another node mid-way (a failover, a resume) goes
    on from the tokens already sent; rendering the whole answer with one
    :class:`TextStream` keeps a character split across the two tries whole
    and finds a stop string that spans them, where each try's own text
    would lose the first try's held-back tail. ``piece`` gives a token's
    bytes (``Engine.token_bytes``)."""

    def __init__(self, piece: Callable[[int], bytes], stop: Sequence[str], max_tokens: int) -> None:
        self._piece = piece
        self._text = TextStream(stop)
        self._left = max_tokens

    @property
    def stopped(self) -> bool:
        """A stop string has appeared: nothing more is rendered."""
        return self._text.stopped

    def feed(self, tokens: Sequence[int]) -> str:
        """The text that is final once ``tokens`` follow the answer so far (everything held, at the last token)."""
        out = "".join(self._text.feed(self._piece(t)) for t in tokens)
        self._left -= len(tokens)
        if tokens and self._left <= 0:
            out += self._text.flush()
        return out

    def flush(self) -> str:
        """Whatever is still held, when the answer ends before its last token."""
        return self._text.flush()
