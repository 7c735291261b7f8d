"""OpenAI request parsing and response shapes, without HTTP.

Request bodies are validated strictly here (types, ranges, sizes) and turned
into p2pinfer values; anything wrong raises :class:`ApiError` with the status
code and the OpenAI error object to answer with.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
import json
import time
from typing import Any
import uuid

from ..engines.base import MAX_TOKENS_LIMIT, GenerationParams

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_MESSAGES",
    "MAX_PROMPT_CHARS",
    "ApiError",
    "ChatRequest",
    "CompletionRequest",
    "error_body",
    "parse_chat",
    "parse_completion",
    "parse_json_body",
]

MAX_BODY_BYTES = 1 << 20
"""Largest request body accepted (1 MiB); larger gets 413 before parsing."""
MAX_PROMPT_CHARS = 400_000
MAX_MESSAGES = 256
_ROLES = {"system", "user", "assistant", "developer", "tool"}


class ApiError(Exception):
    """An error to answer in the OpenAI format."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.retry_after_s = retry_after_s

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def parse_json_body(raw: bytes) -> dict[str, Any]:
    if len(raw) > MAX_BODY_BYTES:
        raise ApiError(413, f"request body of {len(raw)} bytes exceeds {MAX_BODY_BYTES}", code="body_too_large")
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}", code="invalid_json") from None
    except RecursionError:
        raise ApiError(400, "request body nests too deeply", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object", code="invalid_json")
    return body


def _check_text(value: str, param: str) -> str:
    """JSON may carry lone UTF-16 surrogates ("\\ud800"), which no tokenizer can encode."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(400, f"'{param}' contains an unpaired surrogate (invalid Unicode)", param=param) from None
    return value


def _get(body: Mapping[str, Any], key: str, kind: type | tuple[type, ...], default: Any) -> Any:
    value = body.get(key, default)
    if value is None:
        return default
    # bool is an int in Python; JSON true is not a number.
    if isinstance(value, bool) and kind is not bool and (kind is int or kind is float or kind == (int, float)):
        raise ApiError(400, f"'{key}' must be a number", param=key)
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ApiError(400, f"'{key}' must be of type {names}", param=key)
    return value


def _params(body: Mapping[str, Any], default_max_tokens: int) -> GenerationParams:
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is None:
        max_tokens = default_max_tokens
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
        raise ApiError(400, "'max_tokens' must be an integer", param="max_tokens")
    if not 1 <= max_tokens <= MAX_TOKENS_LIMIT:
        raise ApiError(400, f"'max_tokens' must be in 1..{MAX_TOKENS_LIMIT}", param="max_tokens")
    temperature = float(_get(body, "temperature", (int, float), 1.0))
    if not 0.0 <= temperature <= 2.0:
        raise ApiError(400, "'temperature' must be in 0..2", param="temperature")
    top_p = float(_get(body, "top_p", (int, float), 1.0))
    if not 0.0 < top_p <= 1.0:
        raise ApiError(400, "'top_p' must be in (0, 1]", param="top_p")
    seed = _get(body, "seed", int, None)
    if seed is not None and not 0 <= seed < 2**63:
        raise ApiError(400, "'seed' must be in 0..2**63-1", param="seed")
    n = _get(body, "n", int, 1)
    if n != 1:
        raise ApiError(400, "only n=1 is supported", param="n")
    stop_raw = body.get("stop")
    if stop_raw is None:
        stop: tuple[str, ...] = ()
    elif isinstance(stop_raw, str):
        stop = (stop_raw,)
    elif isinstance(stop_raw, list) and all(isinstance(s, str) for s in stop_raw):
        stop = tuple(stop_raw)
    else:
        raise ApiError(400, "'stop' must be a string or a list of strings", param="stop")
    if len(stop) > 4 or any(not s or len(s) > 64 for s in stop):
        raise ApiError(400, "'stop' takes at most 4 strings of 1..64 characters", param="stop")
    for s in stop:
        _check_text(s, "stop")
    for unsupported in ("logprobs", "echo", "best_of", "suffix", "tools", "functions", "logit_bias"):
        value = body.get(unsupported)
        if value not in (None, False, 0, 1, {}, []) or (unsupported in ("tools", "functions") and value):
            raise ApiError(400, f"'{unsupported}' is not supported by p2pinfer", param=unsupported)
    return GenerationParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed, stop=stop)


@dataclass(frozen=True)
class CompletionRequest:
    model: str | None
    prompt: str
    params: GenerationParams
    stream: bool


@dataclass(frozen=True)
class ChatRequest:
    model: str | None
    messages: tuple[dict[str, str], ...]
    params: GenerationParams
    stream: bool


def _common(body: Mapping[str, Any]) -> tuple[str | None, bool]:
    model = _get(body, "model", str, None)
    stream = _get(body, "stream", bool, False)
    return model, stream


def parse_completion(body: Mapping[str, Any]) -> CompletionRequest:
    model, stream = _common(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise ApiError(400, "'prompt' must be a string (batches are not supported)", param="prompt")
    if not prompt:
        raise ApiError(400, "'prompt' is empty", param="prompt")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise ApiError(413, f"'prompt' of {len(prompt)} characters exceeds {MAX_PROMPT_CHARS}", param="prompt", code="prompt_too_large")
    _check_text(prompt, "prompt")
    return CompletionRequest(model, prompt, _params(body, 16), stream)


def parse_chat(body: Mapping[str, Any]) -> ChatRequest:
    model, stream = _common(body)
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise ApiError(400, "'messages' must be a non-empty list", param="messages")
    if len(raw) > MAX_MESSAGES:
        raise ApiError(413, f"at most {MAX_MESSAGES} messages", param="messages", code="prompt_too_large")
    messages: list[dict[str, str]] = []
    total = 0
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise ApiError(400, f"messages[{i}] must be an object", param="messages")
        role, content = m.get("role"), m.get("content")
        if role not in _ROLES:
            raise ApiError(400, f"messages[{i}].role must be one of {sorted(_ROLES)}", param="messages")
        if isinstance(content, list):  # content parts: text only
            parts = []
            for part in content:
                if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                    raise ApiError(400, f"messages[{i}].content: only text parts are supported", param="messages")
                parts.append(part["text"])
            content = "".join(parts)
        if not isinstance(content, str):
            raise ApiError(400, f"messages[{i}].content must be a string", param="messages")
        total += len(content)
        _check_text(content, "messages")
        messages.append({"role": "system" if role == "developer" else role, "content": content})
    if total > MAX_PROMPT_CHARS:
        raise ApiError(413, f"messages of {total} characters exceed {MAX_PROMPT_CHARS}", param="messages", code="prompt_too_large")
    return ChatRequest(model, tuple(messages), _params(body, 256), stream)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now_s() -> int:
    return int(time.time())
