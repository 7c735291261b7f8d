"""What p2pinfer reads off a libp2p connection: the other end's IP, and whether it is relayed."""

from __future__ import annotations

from p2pinfer.net.connections import ip_of, is_relayed, remote_ip


class FakeConn:
    """The one method of a swarm connection these helpers read."""

    def __init__(self, *addrs: str) -> None:
        self.addrs = list(addrs)
        self.calls = 0

    def get_transport_addresses(self) -> list[str]:
        self.calls += 1
        return self.addrs


def test_ip_of_names_the_address_normalised_or_none():
    assert ip_of("/ip4/10.1.2.3/tcp/4001") == "10.1.2.3"
    assert ip_of("/ip6/0:0:0:0:0:0:0:1/tcp/4001") == "::1"
    assert ip_of("/dns4/example.org/tcp/4001") is None
    assert ip_of("not a multiaddr") is None


def test_remote_ip_of_a_direct_connection_is_read_once_and_cached():
    conn = FakeConn("/ip4/192.168.1.7/tcp/4001")
    assert remote_ip(conn) == "192.168.1.7"
    assert remote_ip(conn) == "192.168.1.7"
    assert conn.calls == 1
    assert not is_relayed(conn)


def test_a_relayed_connection_has_no_remote_ip_and_an_unknown_one_is_asked_again():
    relayed = FakeConn("/ip4/1.2.3.4/tcp/4001/p2p/12D3KooWRelay/p2p-circuit")
    assert remote_ip(relayed) is None and is_relayed(relayed)
    unknown = FakeConn()
    assert remote_ip(unknown) is None
    unknown.addrs.append("/ip4/10.0.0.9/tcp/1")
    assert remote_ip(unknown) == "10.0.0.9"
