"""p2pinfer: peer-to-peer LLM inference with prefix-cache-aware routing.

Peers gossip compact digests of their KV caches and each request goes to the
peer that most likely already holds its prefix. See docs/architecture.md.
"""

from ._version import __version__
from .core import (
    BlockHasher,
    Decision,
    Digest,
    DigestError,
    Load,
    ModelFingerprint,
    PeerView,
    RadixTree,
    make_policy,
)
from .engines import Engine, GenerationParams, GenerationRecord, load_engine

__all__ = [
    "BlockHasher",
    "Decision",
    "Digest",
    "DigestError",
    "Engine",
    "GenerationParams",
    "GenerationRecord",
    "Load",
    "ModelFingerprint",
    "PeerView",
    "RadixTree",
    "__version__",
    "load_engine",
    "make_policy",
]
