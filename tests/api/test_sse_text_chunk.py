"""The per-token SSE chunk encodes only its text: its bytes must be what the general encoder writes."""

from __future__ import annotations

import json

from hypothesis import given, strategies as st

from p2pinfer.api.app import _sse_event, _SseTextChunk


def _payload(text: str, model: str = "smollm2") -> dict:
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": model,
            "choices": [{"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": None}]}


@given(st.text())
def test_text_chunk_is_byte_for_byte_the_general_event(text: str) -> None:
    assert _SseTextChunk(_payload)(text) == _sse_event(_payload(text))


def test_multibyte_quotes_and_control_characters() -> None:
    encode = _SseTextChunk(_payload)
    for text in ("é", "日本", "🙂", '"\\\n\t\x00', "\u2028", ""):
        raw = encode(text)
        assert raw == _sse_event(_payload(text))
        assert json.loads(raw[len(b"data: "):-2])["choices"][0]["delta"]["content"] == text


def test_a_model_name_holding_the_slot_text_still_encodes_right() -> None:
    def build(text: str) -> dict:
        return _payload(text, model=_SseTextChunk.SLOT)

    encode = _SseTextChunk(build)
    assert encode("hi") == _sse_event(build("hi"))


# -- items already here go out in one write ---------------------------------------

import trio  # noqa: E402

from p2pinfer.api.app import ApiLimits, _Failure, _sse, _Stream  # noqa: E402
from p2pinfer.api.openai_schema import parse_chat, parse_completion  # noqa: E402
from p2pinfer.engines.base import EngineError, TokenChunk  # noqa: E402

PIECES = ["Hé", "llo", " 日", "本", " 🙂", '"q"', "\n"]


def _events(body: bytes) -> list[str]:
    assert body.endswith(b"\n\n")
    return [e.removeprefix("data: ") for e in body.decode().split("\n\n")[:-1]]


async def _drive(kind: str, tail: list[object]) -> list[bytes]:
    """``_sse`` over a stream whose items are all queued before it starts."""
    send, recv = trio.open_memory_channel[object](64)
    for i, piece in enumerate(PIECES[1:], 1):
        send.send_nowait(TokenChunk((i,), piece))
    for item in tail:
        send.send_nowait(item)
    send.close()
    req = (parse_chat({"messages": [{"role": "user", "content": "hi"}], "stream": True}) if kind == "chat"
           else parse_completion({"prompt": "hi", "stream": True}))
    return [w async for w in _sse(_Stream(recv, trio.CancelScope()), TokenChunk((0,), PIECES[0]), kind, "m", ApiLimits(), req)]


async def test_queued_tokens_go_out_in_one_write_every_token_in_order() -> None:
    writes = await _drive("chat", [])
    assert len(writes) == 1  # all were here: one write, not one per event
    events = _events(writes[0])
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert [c["choices"][0]["delta"]["content"] for c in chunks[1:]] == PIECES


async def test_completion_chunks_in_one_write_keep_their_text() -> None:
    events = _events(b"".join(await _drive("text", [])))
    assert [json.loads(e)["choices"][0]["text"] for e in events[:-1]] == PIECES
    assert events[-1] == "[DONE]"


async def test_a_failure_after_queued_tokens_follows_them() -> None:
    events = _events(b"".join(await _drive("chat", [_Failure(EngineError("boom"))])))
    assert [json.loads(e)["choices"][0]["delta"].get("content") for e in events[1:-2]] == PIECES
    assert "boom" in json.loads(events[-2])["error"]["message"]
    assert events[-1] == "[DONE]"
