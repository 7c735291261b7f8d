from __future__ import annotations

from hypothesis import given, strategies as st

from p2pinfer.engines.text_stream import AnswerText, TextStream


def _feed_all(stream: TextStream, pieces: list[bytes]) -> str:
    out = "".join(stream.feed(p) for p in pieces)
    return out + stream.flush()


def test_a_character_split_across_tokens_is_released_whole() -> None:
    s = TextStream()
    data = "é€".encode()
    assert s.feed(data[:1]) == ""
    assert s.feed(data[1:3]) == "é"
    assert s.feed(data[3:]) == "€"


def test_a_stop_string_across_tokens_cuts_the_text() -> None:
    s = TextStream(stop=("END",))
    assert s.feed(b"abc E") == "abc "
    assert not s.stopped
    assert s.feed(b"N") == ""
    assert s.feed(b"D more") == "" and s.stopped
    assert s.flush() == "" and s.feed(b"x") == ""


def test_a_false_start_is_released() -> None:
    s = TextStream(stop=("END",))
    assert s.feed(b"EN") == ""
    assert s.feed(b"X") == "ENX"


@given(text=st.text(max_size=40), stop=st.text(min_size=1, max_size=4), cuts=st.lists(st.integers(0, 200)))
def test_streamed_text_is_the_text_up_to_the_first_stop(text: str, stop: str, cuts: list[int]) -> None:
    data = text.encode()
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    pieces = [data[a:b] for a, b in zip(points, points[1:])]
    s = TextStream(stop=(stop,))
    got = _feed_all(s, pieces)
    cut = text.find(stop)
    assert got == (text if cut < 0 else text[:cut])
    assert s.stopped == (cut >= 0)


def test_an_answer_split_across_tries_renders_whole_with_the_real_tokenizer(engine: object) -> None:
    """A failover cuts an answer between two tries; one AnswerText over both keeps every character.

    SmolLM2's byte-level tokens split an emoji across several ids, so some cut falls inside
    a character: each try rendering on its own loses the first try's held-back bytes there."""
    text = "naïve 🦙 llamas café"
    ids = engine.tokenize(text, add_special=False)  # type: ignore[attr-defined]
    assert engine.detokenize(ids) == text  # type: ignore[attr-defined]
    broken = 0
    for cut in range(len(ids) + 1):
        one = AnswerText(engine.token_bytes, (), len(ids))  # type: ignore[attr-defined]
        assert one.feed(ids[:cut]) + one.feed(ids[cut:]) == text
        first, second = TextStream(), TextStream()
        apart = "".join(first.feed(engine.token_bytes(t)) for t in ids[:cut])  # type: ignore[attr-defined]
        apart += "".join(second.feed(engine.token_bytes(t)) for t in ids[cut:]) + second.flush()  # type: ignore[attr-defined]
        broken += apart != text
    assert broken > 0  # some cut splits a character: the case this class exists for


def test_a_stop_string_spanning_two_tries_still_stops_the_answer() -> None:
    pieces = {1: b"the E", 2: b"ND of it"}
    answer = AnswerText(pieces.__getitem__, ("END",), 8)
    assert answer.feed([1]) == "the " and not answer.stopped
    assert answer.feed([2]) == "" and answer.stopped
    assert answer.flush() == ""


def test_the_last_token_releases_what_is_held() -> None:
    answer = AnswerText({1: b"ab", 2: b"E"}.__getitem__, ("END",), 2)
    assert answer.feed([1]) == "ab"
    assert answer.feed([2]) == "E"  # max_tokens reached: nothing more can complete the stop string
