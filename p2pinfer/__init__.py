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

_LAZY = {
    # The live node pulls in libp2p; import it only when used.
    "Node": "p2pinfer.node",
    "SyncNode": "p2pinfer.node",
    "GenerateResult": "p2pinfer.node",
    "RequestFailed": "p2pinfer.node",
    "NodeConfig": "p2pinfer.net.config",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'p2pinfer' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "GenerateResult",
    "Node",
    "NodeConfig",
    "RequestFailed",
    "SyncNode",
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
