"""Who needs our idle keep-alives (``Membership.keepalive_wanted``), and the liveness
probe that replaces them for directly connected peers (issue 14)."""

from __future__ import annotations

from types import SimpleNamespace

from p2pinfer.core.peers import Load, PeerView
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


def test_a_connected_peer_without_its_digest_in_the_view_is_pulled_again_backing_off():
    """Without keep-alives nothing else would make us pull it (a failed first pull
    left it in the view with no digest, ineligible for ever)."""
    from p2pinfer.core.digest import Digest

    gossip = GossipConfig(keepalive_interval_s=10.0, peer_ttl_s=30.0)
    met: list[str] = []
    m = membership(gossip)
    m._on_meet = met.append
    m._connected = {A, B}
    m.router.view.update_load(A, Load(), 0.0)
    m._repull_unviewed(0.0)  # A (a load report, no digest) and B (not in the view): first noted
    assert met == []
    m._repull_unviewed(10.0)
    assert sorted(met) == sorted([A, B])
    m._repull_unviewed(25.0)
    assert len(met) == 2  # next after 20 s, not 10
    m._repull_unviewed(30.0)
    assert len(met) == 4
    m.router.view.apply_digest(Digest("full", A, "f" * 64, 0, 0, frozenset(), epoch=5), 31.0)
    m._repull_unviewed(80.0)
    assert met[4:] == [B]  # A's digest arrived: no more pulls of A
