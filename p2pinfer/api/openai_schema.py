"""OpenAI request parsing and response shapes, without HTTP.

Request bodies are validated strictly here (types, ranges, sizes) and turned
into p2pinfer values; anything wrong raises :class:`ApiError` with the status
code and the OpenAI error object to answer with.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
import json
import time
from typing import Any
import uuid

from ..engines.base import MAX_TOKENS_LIMIT, MAX_TOP_LOGPROBS, GenerationParams
from .errors import ApiError, error_body
from .structured import Tools, grammar_for_response_format, history_content, parse_tools

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


_SAMPLING_FIELDS = {
    "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "n", "stop", "stream",
    "stream_options", "presence_penalty", "frequency_penalty", "repetition_penalty", "logprobs", "user",
    "logit_bias", "store",
}
CHAT_FIELDS = frozenset(_SAMPLING_FIELDS | {
    "messages", "top_logprobs", "response_format", "tools", "tool_choice", "parallel_tool_calls",
})
"""Every chat field p2pinfer honours; any other is a 400 that names it."""
COMPLETION_FIELDS = frozenset(_SAMPLING_FIELDS | {"prompt", "echo", "best_of", "suffix"})
_MAX_COMPLETION_LOGPROBS = 5


def _refuse_unknown(body: Mapping[str, Any], allowed: frozenset[str], endpoint: str) -> None:
    for key in body:
        if key not in allowed:
            hint = " (use 'tools')" if key in ("functions", "function_call") else ""
            raise ApiError(400, f"'{key}' is not supported by p2pinfer's {endpoint}{hint}", param=key)
    # Accepted only at the value that asks for nothing.
    for key, neutral in (("logit_bias", ({},)), ("store", (False,)), ("echo", (False,)), ("best_of", (1,)), ("suffix", ("",))):
        value = body.get(key)
        if value is not None and not any(value == v and type(value) is type(v) for v in neutral):
            raise ApiError(400, f"'{key}' is not supported by p2pinfer (only {neutral[0]!r})", param=key)
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise ApiError(400, "'user' must be a string", param="user")


def _number(body: Mapping[str, Any], key: str, default: float, low: float, high: float, *, open_low: bool = False) -> float:
    value = float(_get(body, key, (int, float), default))
    if not (low < value if open_low else low <= value) or not value <= high:
        raise ApiError(400, f"'{key}' must be in {'(' if open_low else ''}{low:g}..{high:g}{')' if open_low else ''}", param=key)
    return value


def _params(body: Mapping[str, Any], default_max_tokens: int, *, chat: bool) -> GenerationParams:
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
    presence = _number(body, "presence_penalty", 0.0, -2.0, 2.0)
    frequency = _number(body, "frequency_penalty", 0.0, -2.0, 2.0)
    repetition = _number(body, "repetition_penalty", 1.0, 0.0, 2.0, open_low=True)
    if chat:
        logprobs = bool(_get(body, "logprobs", bool, False))
        top = _get(body, "top_logprobs", int, None)
        if top is not None:
            if not logprobs:
                raise ApiError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
            if not 0 <= top <= MAX_TOP_LOGPROBS:
                raise ApiError(400, f"'top_logprobs' must be in 0..{MAX_TOP_LOGPROBS}", param="top_logprobs")
        top_logprobs = top or 0
    else:  # completions: `logprobs` is the number of alternatives (0: the sampled token's only)
        count = _get(body, "logprobs", int, None)
        if count is not None and not 0 <= count <= _MAX_COMPLETION_LOGPROBS:
            raise ApiError(400, f"'logprobs' must be in 0..{_MAX_COMPLETION_LOGPROBS}", param="logprobs")
        logprobs, top_logprobs = count is not None, count or 0
    return GenerationParams(
        max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed, stop=stop,
        presence_penalty=presence, frequency_penalty=frequency, repetition_penalty=repetition,
        logprobs=logprobs, top_logprobs=top_logprobs,
    )


@dataclass(frozen=True)
class CompletionRequest:
    model: str | None
    prompt: str
    params: GenerationParams
    stream: bool
    include_usage: bool = False


@dataclass(frozen=True)
class ChatRequest:
    model: str | None
    messages: tuple[dict[str, str], ...]
    params: GenerationParams
    stream: bool
    include_usage: bool = False
    tools: Tools | None = None
    """The request's tools; ``None`` without tools."""


def _common(body: Mapping[str, Any]) -> tuple[str | None, bool, bool]:
    model = _get(body, "model", str, None)
    stream = _get(body, "stream", bool, False)
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise ApiError(400, "'stream_options' is only allowed with 'stream': true", param="stream_options")
        if not isinstance(options, dict):
            raise ApiError(400, "'stream_options' must be an object", param="stream_options")
        for key in options:
            if key != "include_usage":
                raise ApiError(400, f"'stream_options.{key}' is not supported", param="stream_options")
        include_usage = _get(options, "include_usage", bool, False)
    return model, stream, include_usage


def parse_completion(body: Mapping[str, Any]) -> CompletionRequest:
    _refuse_unknown(body, COMPLETION_FIELDS, "completions")
    model, stream, include_usage = _common(body)
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
    return CompletionRequest(model, prompt, _params(body, 16, chat=False), stream, include_usage)


def parse_chat(body: Mapping[str, Any]) -> ChatRequest:
    _refuse_unknown(body, CHAT_FIELDS, "chat completions")
    model, stream, include_usage = _common(body)
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
        unknown = set(m) - {"role", "content", "name", "tool_calls", "tool_call_id", "refusal"}
        if unknown:
            raise ApiError(400, f"messages[{i}].{sorted(unknown)[0]} is not supported", param="messages")
        if m.get("tool_calls") is not None:
            if role != "assistant":
                raise ApiError(400, f"messages[{i}]: only assistant messages have tool_calls", param="messages")
            calls = history_content(m, i)
            content = f"{content}\n{calls}" if isinstance(content, str) and content else calls
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
    params = _params(body, 256, chat=True)
    tools = parse_tools(body.get("tools"), body.get("tool_choice"), body.get("parallel_tool_calls"))
    grammar = None
    if body.get("response_format") is not None:
        grammar = grammar_for_response_format(body["response_format"])
        if grammar is not None and tools is not None and tools.grammar is not None:
            raise ApiError(400, "'response_format' with 'tools' the model may call is not supported "
                           "(use tool_choice 'none', or a tool whose parameters are the schema)", param="response_format")
    if tools is not None and tools.grammar is not None:
        grammar = tools.grammar
    if grammar is not None:
        params = replace(params, grammar=grammar)
    return ChatRequest(model, tuple(messages), params, stream, include_usage, tools)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now_s() -> int:
    return int(time.time())
