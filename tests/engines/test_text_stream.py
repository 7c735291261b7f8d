from __future__ import annotations

from hypothesis import given, strategies as st

from p2pinfer.engines.text_stream import TextStream


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
