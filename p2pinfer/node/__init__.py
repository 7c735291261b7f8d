"""The live node: an engine, the routing core and a libp2p overlay.

``async with Node(config) as node`` starts everything in a nursery the node
owns; ``node.generate(...)`` routes one request and serves it here or
forwards it; :class:`SyncNode` runs a node on a thread for plain scripts.
"""

from ..core.attempts import Attempt
from ..net.config import NodeConfig
from ..net.forward import DeadlineExceeded
from .results import GenerateResult, ModelUnavailable, NodeError, RequestFailed, ToolPrompt
from .sync import SyncNode
from .wiring import Node

__all__ = [
    "Attempt",
    "DeadlineExceeded",
    "GenerateResult",
    "ModelUnavailable",
    "Node",
    "NodeConfig",
    "NodeError",
    "RequestFailed",
    "SyncNode",
    "ToolPrompt",
]
