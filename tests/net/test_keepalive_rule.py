"""Who needs our idle keep-alives (``Membership.keepalive_wanted``), and the liveness
probe that replaces them for directly connected peers (issue 14)."""

from __future__ import annotations

from types import SimpleNamespace

from p2pinfer.core.peers import PeerView
from p2pinfer.core.router import GossipConfig, RouterConfig
from p2pinfer.lab.node_process import fast_config
from p2pinfer.net.counters import NodeCounters
from p2pinfer.net.membership import Membership, _Probe

A = "12D3KooWSv34eYWJ6EytpkoVyRywvhzbJsCMFeUjuLJUTQ9fWNKB"
B = "12D3KooWSrxkMoT46JqmDnkWWfKxvevBSm6qLUiuzxccGUNJxrph"


def membership(gossip: GossipConfig) -> Membership:
    router = SimpleNamespace(view=PeerView("f" * 64, "me"), config=RouterConfig(gossip=gossip))
    m = Membership(
        host=None, router=router, config=fast_config(gossip=gossip), counters=NodeCounters(), self_id="me",  # type: ignore[arg-type]
        on_meet=lambda _p: None, on_gone=lambda _p: None,  # type: ignore[arg-type,return-value]
    )
    return m


def test_keepalives_go_out_only_while_a_peer_in_the_view_is_not_directly_connected():
    m = membership(GossipConfig())  # keep-alive 10 s
    m._connections_changed_at = 0.0
    assert m.keepalive_wanted(19.0)  # a connection changed: the swarm learns where we are
    assert not m.keepalive_wanted(20.0)  # nobody to tell
    m.router.view.add(A, 0.0)
    m.router.view.add(B, 0.0)
    m._connected = {A}
    assert m.keepalive_wanted(20.0)  # B hears of us through gossip alone
    m._connected = {A, B}
    assert not m.keepalive_wanted(20.0)  # both see our connection and probe us
    m._connected = {A, B, "a relay of another model"}
    assert not m.keepalive_wanted(20.0)


def test_a_connected_peer_is_probed_once_silent_for_the_ttl_less_one_keepalive():
    gossip = GossipConfig(keepalive_interval_s=10.0, peer_ttl_s=30.0)
    m = membership(gossip)
    state = m.router.view.add(A, 100.0)
    probe = _Probe(interval=30.0, due=150.0)  # the RTT schedule alone: past the TTL
    assert m._probe_due(state, probe) == 120.0
    probe.tried = 120.0  # that probe failed: no second liveness probe, the RTT schedule's
    assert m._probe_due(state, probe) == 150.0
    state.last_seen = 121.0  # it succeeded, or the peer spoke: the next silence counts
    assert m._probe_due(state, probe) == 141.0
