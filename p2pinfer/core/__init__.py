"""The sans-I/O routing core: pure, deterministic, typed.

Nothing here imports the network or an engine; the live node and the
simulator both run this code unchanged.
"""

from .blocks import DEFAULT_BLOCK_SIZE, BlockHasher, ModelFingerprint
from .costmodel import EngineCostModel
from .digest import Digest, DigestError, DigestTracker, decode_digest, encode_digest
from .directory import AnchorTracker, DirectoryConfig, DirectoryError, DirectoryStore, DirectoryView, Rendezvous
from .peers import Load, PeerState, PeerView
from .policies import (
    LOCAL,
    POLICIES,
    TtftEstimator,
    CostPolicy,
    Decision,
    LocalState,
    NoCandidateError,
    Policy,
    RouteRequest,
    make_policy,
)
from .radix import PinHandle, RadixTree, TreeEvent

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "AnchorTracker",
    "DirectoryConfig",
    "DirectoryError",
    "DirectoryStore",
    "DirectoryView",
    "Rendezvous",
    "LOCAL",
    "POLICIES",
    "BlockHasher",
    "TtftEstimator",
    "CostPolicy",
    "Decision",
    "Digest",
    "DigestError",
    "DigestTracker",
    "EngineCostModel",
    "Load",
    "LocalState",
    "ModelFingerprint",
    "NoCandidateError",
    "PeerState",
    "PeerView",
    "PinHandle",
    "Policy",
    "RadixTree",
    "RouteRequest",
    "TreeEvent",
    "decode_digest",
    "encode_digest",
    "make_policy",
]

from .router import GossipConfig, Router, RouterConfig, TrustConfig  # noqa: E402

__all__ += ["GossipConfig", "Router", "RouterConfig", "TrustConfig"]
from .attempts import RequestAttempts  # noqa: E402
from .engine_queue import EngineQueue  # noqa: E402

__all__ += ["EngineQueue", "RequestAttempts"]
