"""Small facts about py-libp2p connections: relayed or direct, which one a stream uses.

py-libp2p tags a connection that runs over a circuit relay with a
``/p2p-circuit`` transport address (both on the dialing side and on the
side that accepted it through the stop protocol); everything else is a
direct TCP connection.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import Any

import multiaddr
from libp2p.abc import IHost, INetConn, INetStream
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

__all__ = ["connections_of", "is_relayed", "open_stream_on", "relay_of", "swarm_conn_of"]


def connections_of(host: IHost, peer_id: str | ID) -> list[INetConn]:
    """Open connections to ``peer_id`` (any kind)."""
    pid = ID.from_base58(peer_id) if isinstance(peer_id, str) else peer_id
    try:
        conns = host.get_network().get_connections(pid)
    except Exception:
        return []
    return [c for c in conns if not getattr(c, "is_closed", False)]


def _addrs(conn: Any) -> list[str]:
    try:
        return [str(a) for a in conn.get_transport_addresses() or []]
    except Exception:
        return []


_KIND_ATTR = "_p2pinfer_relayed"


def is_relayed(conn: Any) -> bool:
    """Whether ``conn`` runs through a circuit relay.

    Cached on the connection once its transport address is known (turning
    multiaddrs into text is slow in py-multiaddr, and this is asked often).
    An inbound relayed connection gets its circuit address only after it is
    registered, so a connection without addresses yet is not cached.
    """
    cached = getattr(conn, _KIND_ATTR, None)
    if cached is not None:
        return bool(cached)
    addrs = _addrs(conn)
    if any("/p2p-circuit" in a for a in addrs):
        kind: bool | None = True
    elif any(a.startswith("/ip4/") or a.startswith("/ip6/") for a in addrs):
        kind = False
    else:
        kind = None
    if kind is not None:
        try:
            setattr(conn, _KIND_ATTR, kind)
        except AttributeError:
            pass
    return bool(kind)


def relay_of(conn: Any) -> str | None:
    """The relay's peer id of a relayed connection (``/p2p/<relay>/p2p-circuit/...``)."""
    for addr in _addrs(conn):
        if "/p2p-circuit" in addr:
            head = addr.split("/p2p-circuit")[0]
            if "/p2p/" in head:
                return head.rsplit("/p2p/", 1)[1].split("/")[0]
    return None


_IP_ATTR = "_p2pinfer_remote_ip"


def ip_of(addr: str) -> str | None:
    """The IP address a multiaddr names (normalised), or ``None``."""
    try:
        ma = multiaddr.Multiaddr(addr)
    except Exception:
        return None
    for proto in ("ip4", "ip6"):
        try:
            value = ma.value_for_protocol(proto)
        except Exception:
            continue
        if value:
            try:
                return str(ipaddress.ip_address(value))
            except ValueError:
                return None
    return None


def remote_ip(conn: Any) -> str | None:
    """The IP address at the other end of a direct connection (``None`` when
    not known yet, or relayed); cached on the connection once known."""
    cached = getattr(conn, _IP_ATTR, None)
    if cached is not None:
        return cached
    for addr in _addrs(conn):
        if "/p2p-circuit" in addr:
            return None
        ip = ip_of(addr)
        if ip is not None:
            try:
                setattr(conn, _IP_ATTR, ip)
            except AttributeError:
                pass
            return ip
    return None


def swarm_conn_of(host: IHost, stream: INetStream) -> INetConn | None:
    """The swarm connection a stream runs on."""
    muxed = getattr(stream, "muxed_conn", None)
    try:
        peer = muxed.peer_id  # type: ignore[union-attr]
    except Exception:
        return None
    for conn in connections_of(host, peer):
        if getattr(conn, "muxed_conn", None) is muxed:
            return conn
    return None


async def open_stream_on(host: IHost, conn: INetConn, protocols: Sequence[TProtocol], timeout_s: float) -> INetStream:
    """A stream on this very connection (``host.new_stream`` picks one by itself).

    Negotiated with multistream-select exactly as ``BasicHost.new_stream`` does.
    """
    import trio
    from libp2p.protocol_muxer.multiselect_communicator import MultiselectCommunicator

    with trio.fail_after(timeout_s):
        stream = await conn.new_stream()
        try:
            protocol = await host.multiselect_client.select_one_of(  # type: ignore[attr-defined]
                list(protocols), MultiselectCommunicator(stream), max(1, int(timeout_s))
            )
        except BaseException:
            with trio.CancelScope(shield=True):
                try:
                    await stream.reset()
                except Exception:
                    pass
            raise
        stream.set_protocol(protocol)
        return stream
