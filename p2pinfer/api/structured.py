"""Structured output and tool calls: OpenAI's ``response_format`` and ``tools``
turned into a llama.cpp grammar (GBNF) that constrains sampling, and the
constrained answer turned back into ``tool_calls``.

The grammar is built here, at the entry node, and travels with the request
(``GenerationParams.grammar``), so a forwarded or delegated request is
constrained exactly as a local one. JSON schemas are converted with
llama-cpp-python's own converter (``llama_cpp.llama_grammar``); a schema it
cannot convert is a 400 that names the field.

A tool call is written as ``{"name": <function>, "arguments": {...}}`` (the
form the system instruction of :func:`~p2pinfer.engines.base.with_tool_instructions`
describes), its arguments constrained by the function's ``parameters`` schema.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
import json
import re
from typing import Any
import uuid

from .errors import ApiError

__all__ = ["ToolCall", "Tools", "grammar_for_response_format", "parse_tool_call", "parse_tools"]

_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
_MAX_TOOLS = 64


def _schema_to_gbnf(schema: Mapping[str, Any], param: str) -> str:
    try:
        from llama_cpp.llama_grammar import json_schema_to_gbnf  # noqa: PLC0415
    except ImportError:
        raise ApiError(400, f"'{param}' needs llama-cpp-python on the entry node (pip install 'p2pinfer[llama]')",
                       param=param) from None
    try:
        return json_schema_to_gbnf(json.dumps(schema))
    except Exception as exc:  # the converter raises many kinds for schemas it cannot express
        raise ApiError(400, f"'{param}': the JSON schema cannot be turned into a grammar: {type(exc).__name__}: {exc}",
                       param=param) from None


def grammar_for_response_format(value: Any) -> str | None:
    """``response_format`` → a grammar (``None`` for plain text)."""
    if not isinstance(value, Mapping) or not isinstance(value.get("type"), str):
        raise ApiError(400, "'response_format' must be an object with a 'type'", param="response_format")
    kind = value["type"]
    extra = set(value) - {"type", "json_schema"}
    if extra:
        raise ApiError(400, f"'response_format.{sorted(extra)[0]}' is not supported", param="response_format")
    if kind == "text":
        return None
    if kind == "json_object":
        return _schema_to_gbnf({"type": "object"}, "response_format")
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, Mapping):
            raise ApiError(400, "'response_format.json_schema' must be an object", param="response_format")
        unknown = set(spec) - {"name", "schema", "strict", "description"}
        if unknown:
            raise ApiError(400, f"'response_format.json_schema.{sorted(unknown)[0]}' is not supported", param="response_format")
        if not isinstance(spec.get("name"), str) or not _NAME_RE.fullmatch(spec["name"]):
            raise ApiError(400, "'response_format.json_schema.name' must be 1..64 letters, digits, '_' or '-'",
                           param="response_format")
        if "strict" in spec and spec["strict"] is not None and not isinstance(spec["strict"], bool):
            raise ApiError(400, "'response_format.json_schema.strict' must be a boolean", param="response_format")
        schema = spec.get("schema", {"type": "object"})
        if not isinstance(schema, Mapping):
            raise ApiError(400, "'response_format.json_schema.schema' must be an object", param="response_format")
        # strict or not, sampling is constrained: the answer always matches the schema.
        return _schema_to_gbnf(schema, "response_format")
    raise ApiError(400, f"'response_format.type' {kind!r} is not supported (text, json_object, json_schema)",
                   param="response_format")


@dataclass(frozen=True)
class Tools:
    """A request's tools and what it allows the model to do with them."""

    tools: tuple[dict[str, Any], ...]
    """As sent (for the chat template)."""
    choice: str
    """``auto``, ``required``, ``none`` or the one function's name the request forces."""
    grammar: str | None
    """``None`` when the model may not call a tool (``none``)."""

    @property
    def names(self) -> set[str]:
        return {t["function"]["name"] for t in self.tools}


def parse_tools(tools: Any, tool_choice: Any, parallel: Any) -> Tools | None:
    """Check ``tools``/``tool_choice``/``parallel_tool_calls`` and build the tool-call grammar."""
    if tools is None:
        if tool_choice not in (None, "none"):
            raise ApiError(400, "'tool_choice' needs 'tools'", param="tool_choice")
        if parallel is not None and not isinstance(parallel, bool):
            raise ApiError(400, "'parallel_tool_calls' must be a boolean", param="parallel_tool_calls")
        return None
    if not isinstance(tools, list) or not 1 <= len(tools) <= _MAX_TOOLS:
        raise ApiError(400, f"'tools' must be a list of 1..{_MAX_TOOLS} tools", param="tools")
    if parallel is not None and not isinstance(parallel, bool):
        raise ApiError(400, "'parallel_tool_calls' must be a boolean", param="parallel_tool_calls")
    clean: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping) or tool.get("type") != "function" or not isinstance(tool.get("function"), Mapping):
            raise ApiError(400, f"tools[{i}] must be {{'type': 'function', 'function': {{...}}}} (only functions are supported)",
                           param="tools")
        fn = tool["function"]
        unknown = set(fn) - {"name", "description", "parameters", "strict"}
        if unknown:
            raise ApiError(400, f"tools[{i}].function.{sorted(unknown)[0]} is not supported", param="tools")
        if not isinstance(fn.get("name"), str) or not _NAME_RE.fullmatch(fn["name"]):
            raise ApiError(400, f"tools[{i}].function.name must be 1..64 letters, digits, '_' or '-'", param="tools")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, Mapping):
            raise ApiError(400, f"tools[{i}].function.parameters must be a JSON schema object", param="tools")
        if fn.get("description") is not None and not isinstance(fn["description"], str):
            raise ApiError(400, f"tools[{i}].function.description must be a string", param="tools")
        clean.append({"type": "function", "function": {**fn, "parameters": params}})
    names = [t["function"]["name"] for t in clean]
    if len(set(names)) != len(names):
        raise ApiError(400, "tool names must be unique", param="tools")
    if tool_choice in (None, "auto"):
        choice = "auto"
    elif tool_choice in ("none", "required"):
        choice = tool_choice
    elif (isinstance(tool_choice, Mapping) and tool_choice.get("type") == "function"
          and isinstance(tool_choice.get("function"), Mapping) and tool_choice["function"].get("name") in names):
        choice = tool_choice["function"]["name"]
    else:
        raise ApiError(400, "'tool_choice' must be 'none', 'auto', 'required' or "
                       "{'type': 'function', 'function': {'name': <one of the tools>}}", param="tool_choice")
    if choice == "none":
        return Tools(tuple(clean), choice, None)
    chosen = [t for t in clean if choice in ("auto", "required") or t["function"]["name"] == choice]
    call = {"oneOf": [
        {"type": "object",
         "properties": {"name": {"const": t["function"]["name"]}, "arguments": t["function"]["parameters"]},
         "required": ["name", "arguments"], "additionalProperties": False}
        for t in chosen
    ]} if len(chosen) > 1 else {
        "type": "object",
        "properties": {"name": {"const": chosen[0]["function"]["name"]}, "arguments": chosen[0]["function"]["parameters"]},
        "required": ["name", "arguments"], "additionalProperties": False,
    }
    grammar = _schema_to_gbnf(call, "tools")
    if choice == "auto":
        # Either a call, or text that does not start like one.
        grammar = re.sub(r"^root ::=", "tool-call ::=", grammar, flags=re.M)
        grammar += '\nroot ::= tool-call | free-text\nfree-text ::= [^{ \\t\\n] [^\\x00]*\n'
    return Tools(tuple(clean), choice, grammar)


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str
    """JSON text, as OpenAI sends it."""

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def parse_tool_call(text: str, tools: Tools) -> ToolCall | None:
    """The call in a constrained answer, or ``None`` when the model answered in text
    (``auto``) or was cut short (``max_tokens``) before the call was complete."""
    if tools.grammar is None:
        return None
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return None
    if not (isinstance(value, dict) and value.get("name") in tools.names and isinstance(value.get("arguments"), dict)):
        return None
    return ToolCall(f"call_{uuid.uuid4().hex[:24]}", value["name"], json.dumps(value["arguments"], ensure_ascii=False))


def history_content(message: Mapping[str, Any], i: int) -> str:
    """An earlier assistant turn's ``tool_calls`` as the text the model wrote them in."""
    calls = message.get("tool_calls")
    if not isinstance(calls, Sequence) or isinstance(calls, str) or not calls:
        raise ApiError(400, f"messages[{i}].tool_calls must be a non-empty list", param="messages")
    out = []
    for call in calls:
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not isinstance(fn.get("arguments"), str):
            raise ApiError(400, f"messages[{i}].tool_calls: each needs function.name and function.arguments (a string)",
                           param="messages")
        try:
            args = json.loads(fn["arguments"])
        except json.JSONDecodeError:
            raise ApiError(400, f"messages[{i}].tool_calls: arguments must be JSON text", param="messages") from None
        out.append(json.dumps({"name": fn["name"], "arguments": args}, ensure_ascii=False))
    return "\n".join(out)
