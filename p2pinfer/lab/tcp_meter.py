"""TCP bytes per process over a window, sockets closed during it included.

The kernel keeps ``bytes_received`` and ``bytes_acked`` per socket
(``tcp_info``, read with ``ss -tinpe``), not per process, and forgets them
when the socket closes. Two snapshots of a process's open sockets therefore
lose every byte of a connection that closes between them, and the difference
can go negative (a swarm whose connections churn did, at 64 nodes).

:class:`SocketByteLedger` keys each socket by its kernel cookie (``sk:``),
so a socket keeps what it counted at its last reading after it closes, and a
socket opened during the window counts from zero. :class:`TcpByteMeter`
feeds it by polling ``ss`` from a thread. What is still missed: the bytes a
socket moves after its last reading, if it closes before the next one (at
most one poll interval of its traffic), which is why the meter reports how
many sockets closed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import re
import shutil
import subprocess
import threading
from typing import Iterable, Mapping

__all__ = ["SocketByteLedger", "SocketReading", "TcpByteMeter", "read_sockets"]

_PID_RE = re.compile(r"pid=(\d+)")
_COOKIE_RE = re.compile(r"\bsk:([0-9a-f]+)")
_BYTES_RE = re.compile(r"\b(bytes_acked|bytes_received):(\d+)")


@dataclass(frozen=True)
class SocketReading:
    """One established socket at one reading: whose it is and its byte counters so far."""

    cookie: str
    pid: int
    bytes_in: int
    bytes_out: int


def parse_ss(text: str, pids: set[int]) -> list[SocketReading]:
    """Sockets owned by ``pids`` in ``ss -tinpeH`` output (a socket line, then its info line)."""
    found: list[SocketReading] = []
    owner: int | None = None
    cookie: str | None = None
    counts = [0, 0]

    def flush() -> None:
        if owner is not None and cookie is not None:
            found.append(SocketReading(cookie, owner, counts[0], counts[1]))

    for line in text.splitlines():
        if not line.startswith((" ", "\t")):
            flush()
            owner = next((p for p in map(int, _PID_RE.findall(line)) if p in pids), None)
            match = _COOKIE_RE.search(line)
            cookie = match.group(1) if match else None
            counts = [0, 0]
        if owner is None:
            continue
        for key, value in _BYTES_RE.findall(line):
            counts[0 if key == "bytes_received" else 1] = int(value)
    flush()
    return found


def read_sockets(pids: set[int]) -> list[SocketReading] | None:
    """The established TCP sockets of ``pids`` now, or None where ``ss`` is missing."""
    if shutil.which("ss") is None:
        return None
    out = subprocess.run(["ss", "-tinpeH", "state", "established"], capture_output=True, text=True, check=False)
    return parse_ss(out.stdout, pids)


@dataclass
class SocketByteLedger:
    """Bytes per pid since the first reading, from repeated readings of its sockets.

    A socket present at the first reading counts from its value then; one
    first seen later counts from zero (it opened in the window); one that
    disappears keeps its last value. Per-socket counters only grow, so the
    totals never go negative.
    """

    _base: dict[str, tuple[int, int]] = field(default_factory=dict)
    _last: dict[str, SocketReading] = field(default_factory=dict)
    _open: set[str] = field(default_factory=set)
    readings: int = 0

    def observe(self, sockets: Iterable[SocketReading]) -> None:
        current = {s.cookie: s for s in sockets}
        if not self.readings:
            self._base = {c: (s.bytes_in, s.bytes_out) for c, s in current.items()}
        self._last.update(current)
        self._open = set(current)
        self.readings += 1

    def totals(self, pids: Iterable[int]) -> dict[int, tuple[int, int]]:
        """(bytes in, bytes out) per pid; a pid with no socket seen gets (0, 0)."""
        out = {pid: [0, 0] for pid in pids}
        for cookie, s in self._last.items():
            if s.pid not in out:
                continue
            base_in, base_out = self._base.get(cookie, (0, 0))
            out[s.pid][0] += s.bytes_in - base_in
            out[s.pid][1] += s.bytes_out - base_out
        return {pid: (v[0], v[1]) for pid, v in out.items()}

    @property
    def sockets_seen(self) -> int:
        return len(self._last)

    @property
    def sockets_closed(self) -> int:
        """Sockets seen at some reading and gone at the latest one."""
        return len(set(self._last) - self._open)


class TcpByteMeter:
    """Polls ``ss`` every ``interval_s`` between :meth:`start` and :meth:`stop`.

    ``available`` is False where ``ss`` is missing; the totals are then empty.
    :meth:`poll` takes one reading now (the thread calls it; a test can too).
    """

    def __init__(self, pids: Iterable[int], interval_s: float = 1.0) -> None:
        self.pids = set(pids)
        self.interval_s = interval_s
        self.ledger = SocketByteLedger()
        self.available = shutil.which("ss") is not None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def poll(self) -> None:
        sockets = read_sockets(self.pids) if self.available else None
        if sockets is not None:
            with self._lock:
                self.ledger.observe(sockets)

    def start(self) -> "TcpByteMeter":
        self.poll()
        self._thread = threading.Thread(target=self._run, name="tcp-byte-meter", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll()

    def close(self) -> None:
        """Stop polling (idempotent): for a window that ends in an error."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def stop(self) -> dict[int, tuple[int, int]] | None:
        """Stop polling after one last reading; (bytes in, bytes out) per pid, or None without ``ss``."""
        self.close()
        if not self.available:
            return None
        self.poll()
        with self._lock:
            return self.ledger.totals(self.pids)

    def summary(self) -> Mapping[str, float | int]:
        """How the window was counted, for the JSON beside the figures."""
        return {
            "bytes_poll_interval_s": self.interval_s,
            "bytes_readings": self.ledger.readings,
            "sockets_seen": self.ledger.sockets_seen,
            "sockets_closed": self.ledger.sockets_closed,
        }
