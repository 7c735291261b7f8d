"""The benches' TCP byte meter counts the bytes of sockets that close during the window.

Two snapshots of a process's open sockets lose a connection that closes
between them (a 64-node `bench directory` run came out at negative bytes per
node that way); the ledger keeps each socket's last reading.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from p2pinfer.lab.tcp_meter import SocketByteLedger, SocketReading, TcpByteMeter, parse_ss, read_sockets

SS_SAMPLE = """\
0      0      127.0.0.1:44007 127.0.0.1:54242 users:(("python3",pid=1718,fd=5)) ino:4545 sk:1 cgroup:/ <->
\t ts sack bbr wscale:10,10 rto:200 mss:32768 cwnd:10 bytes_received:1000 segs_out:1 segs_in:3 data_segs_in:1
0      0      127.0.0.1:54242 127.0.0.1:44007 users:(("python3",pid=1718,fd=4)) ino:4544 sk:2 cgroup:/ <->
\t ts sack bbr wscale:10,10 rto:204 mss:35328 cwnd:11 bytes_sent:1000 bytes_acked:1001 segs_out:3 segs_in:2
0      0      127.0.0.1:6000 127.0.0.1:6001 users:(("other",pid=99,fd=4)) ino:4000 sk:3a cgroup:/ <->
\t ts sack bytes_received:77 bytes_acked:5
"""


def test_parse_ss_reads_cookie_owner_and_counters_of_the_pids_asked_for() -> None:
    got = parse_ss(SS_SAMPLE, {1718})
    assert got == [SocketReading("1", 1718, 1000, 0), SocketReading("2", 1718, 0, 1001)]
    assert parse_ss(SS_SAMPLE, {99}) == [SocketReading("3a", 99, 77, 5)]


def test_ledger_keeps_a_closed_socket_and_counts_a_new_one_from_zero() -> None:
    ledger = SocketByteLedger()
    ledger.observe([SocketReading("a", 1, 5_000, 100), SocketReading("b", 1, 800, 0)])
    ledger.observe([SocketReading("a", 1, 9_000, 300), SocketReading("b", 1, 1_800, 0), SocketReading("c", 1, 40, 4)])
    ledger.observe([SocketReading("c", 1, 640, 64)])  # a and b closed, c opened in the window
    assert ledger.totals([1, 2]) == {1: (4_000 + 1_000 + 640, 200 + 64), 2: (0, 0)}
    assert ledger.sockets_seen == 3 and ledger.sockets_closed == 2
    # What the two-snapshot count gave: the last reading minus the first, over open sockets only.
    assert 640 - (5_000 + 800) < 0


_CHILD = textwrap.dedent(
    """
    import socket, sys
    say = lambda word: (print(word), sys.stdout.flush())
    listener = socket.create_server(("127.0.0.1", 0))
    say("ready")
    assert sys.stdin.readline().strip() == "open"
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    client.sendall(b"x" * 100_000)
    got = 0
    while got < 100_000:
        got += len(server.recv(65536))
    say("sent")
    assert sys.stdin.readline().strip() == "close"
    client.close(); server.close()
    say("closed")
    sys.stdin.readline()
    """
)


def test_meter_counts_a_real_connection_that_opens_and_closes_inside_the_window() -> None:
    child = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None

    def tell(word: str, answer: str) -> None:
        child.stdin.write(word + "\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == answer

    try:
        assert child.stdout.readline().strip() == "ready"
        meter = TcpByteMeter([child.pid], interval_s=3600.0)
        assert meter.available, "ss (iproute2) is needed by the benches' byte counts"
        meter.start()  # the first reading: the connection does not exist yet
        tell("open", "sent")
        meter.poll()
        tell("close", "closed")
        assert read_sockets({child.pid}) == []  # a snapshot now sees nothing of the connection
        totals = meter.stop()
    finally:
        child.kill()
        child.wait()
    assert totals is not None
    bytes_in, bytes_out = totals[child.pid]
    assert bytes_in == 100_000  # the server side's bytes_received; the client received nothing
    assert bytes_out >= 100_000  # bytes_acked of the client (the SYN counts one more)
    assert meter.summary()["sockets_closed"] == 2
