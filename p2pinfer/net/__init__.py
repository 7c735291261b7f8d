"""The overlay: everything a node says to other nodes, over py-libp2p (trio).

One module per job: :mod:`.config` (NodeConfig), :mod:`.identity` (key
file), :mod:`.host` (libp2p host, gossipsub, pnet key), :mod:`.framing` and
:mod:`.wire` (frames and protobuf messages of protos/p2pinfer.proto),
:mod:`.gossip` (digest and load gossip, validators), :mod:`.pull`
(digest pulls and peer exchange), :mod:`.forward` (the generate protocol,
both sides), :mod:`.membership` (dialing, discovery, liveness, RTT),
:mod:`.sanctions` (distrusted peers, gossipsub scoring), :mod:`.other_models`
(peers of another model), :mod:`.model_gossip` (the models topic),
:mod:`.directory` (the prefix directory protocol), :mod:`.origin_rate` (a
per-origin message budget for the validators), NAT traversal
(:mod:`.reachability`, :mod:`.relay` and :mod:`.relay_client` for circuit
relay v2, :mod:`.paths` for DCUtR hole punching and the path to each peer,
:mod:`.connections`), :mod:`.wakeup`, :mod:`.libp2p_patches` and
:mod:`.counters`. :class:`p2pinfer.node.Node` puts them together. The
lying router and the other test-only peers live in the lab
(:mod:`p2pinfer.lab.lying`), which this package never imports.
Importing this package does not import libp2p.
"""
