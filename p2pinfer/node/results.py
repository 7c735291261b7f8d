"""What a request on a live node ends with: a result, or an explicit failure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..core.attempts import Attempt
from ..core.policies import Decision
from ..engines.base import ChatMessage, GenerationRecord

__all__ = ["GenerateResult", "ModelUnavailable", "NodeError", "Prompt", "RequestFailed", "ToolPrompt"]


@dataclass(frozen=True)
class ToolPrompt:
    """Chat messages and the OpenAI ``tools`` the model may call, for its chat template."""

    messages: Sequence[ChatMessage]
    tools: Sequence[Mapping[str, Any]]


Prompt = str | Sequence[int] | Sequence[ChatMessage] | ToolPrompt
"""Text, chat messages (through the model's template), token ids, or messages with tools."""


class NodeError(RuntimeError):
    """The node cannot do what was asked (not started, bad prompt type...)."""


class ModelUnavailable(NodeError):
    """The swarm knows the requested model but no node serves it right now (HTTP 503)."""


class RequestFailed(NodeError):
    """Every candidate refused or failed; ``attempts`` says what each did."""

    def __init__(self, message: str, attempts: list[Attempt]) -> None:
        super().__init__(message)
        self.attempts = attempts


@dataclass
class GenerateResult:
    """The last item of :meth:`Node.generate`: what happened and why."""

    request_id: str
    served_by: str
    served_locally: bool
    hops: int
    policy: str
    reason: str
    predicted_reused_tokens: int
    reused_tokens: int
    """Realised: prompt tokens the serving engine took from its cache."""
    prompt_tokens: int
    generated_tokens: int
    token_ids: list[int]
    text: str
    finish_reason: str
    ttft_s: float
    """Measured at this node, from the call to the first token."""
    total_s: float
    record: GenerationRecord
    """The serving engine's own record (of the last attempt)."""
    attempts: list[Attempt] = field(default_factory=list)
    decision: Decision | None = None
    model: str = ""
    """Fingerprint of the model that served it."""
    logprobs: list[Any] = field(default_factory=list)
    """Each generated token's :class:`~p2pinfer.engines.base.TokenLogprob`, when asked for."""
    path: str | None = None
    """How the serving attempt reached its peer: ``local``, ``direct``, ``hole-punched`` or ``relayed``."""
    decision_s: float | None = None
    """From the call to the policy's decision, at this node: hashing, the directory lookup (when the
    node queries the directory) and the policy's ranking; ``None`` when the request was delegated."""

    def as_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k not in ("record", "attempts", "decision", "logprobs")}
        out["record"] = asdict(self.record)
        out["attempts"] = [a.as_dict() for a in self.attempts]
        out["decision"] = self.decision.as_dict() if self.decision else None
        return out
