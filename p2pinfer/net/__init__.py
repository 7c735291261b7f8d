"""The overlay: everything a node says to other nodes, over py-libp2p (trio).

One module per job: :mod:`.config` (NodeConfig), :mod:`.identity` (key
file), :mod:`.host` (libp2p host, gossipsub, pnet key), :mod:`.framing` and
:mod:`.wire` (frames and protobuf messages of protos/p2pinfer.proto),
:mod:`.gossip` (digest and load gossip, validators), :mod:`.pull`
(digest pulls and peer exchange), :mod:`.forward` (the generate protocol,
both sides), :mod:`.membership` (dialing, discovery, liveness, RTT),
:mod:`.sanctions` (distrusted peers, gossipsub scoring), :mod:`.other_models`
(peers of another model) and :mod:`.counters`; :mod:`.lying` is a test-only
lying router. :class:`p2pinfer.node.Node` puts them together.
Importing this package does not import libp2p.
"""
