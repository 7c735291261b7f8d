"""The ``/p2pinfer/check/1.0.0`` messages (protos/p2pinfer.proto): what a verifier accepts,
and which answers of a verifier cannot be a real model's scores of the answer asked about."""

from __future__ import annotations

import math

from hypothesis import given, settings, strategies as st
import pytest

from p2pinfer.net.wire import (
    CHECK_MAX_ANSWER_TOKENS,
    CHECK_MAX_PROMPT_TOKENS,
    PeerScore,
    RemoteError,
    WireError,
    decode_check_request,
    decode_check_response,
    encode_check_error,
    encode_check_request,
    encode_check_response,
)

FP = "0123456789abcdef"
VOCAB = 1000


def score(token: int, logprob: float = -0.5, best: float = -0.25, mean: float = -1.0, var: float = 0.5) -> PeerScore:
    return PeerScore(token, logprob, best, mean, var)


def test_request_round_trip():
    q = decode_check_request(encode_check_request(FP, [1, 2, 3], [4, 5], 0.7), fingerprint=FP, vocab_size=VOCAB)
    assert (q.prompt, q.answer) == ([1, 2, 3], [4, 5]) and q.temperature == pytest.approx(0.7)


@pytest.mark.parametrize(
    "prompt, answer, temperature, fingerprint, code, words",
    [
        ([1], [2], 1.0, "ffff", "MODEL_MISMATCH", "fingerprint"),
        ([], [2], 1.0, FP, "BAD_REQUEST", "needs a prompt"),
        ([1], [], 1.0, FP, "BAD_REQUEST", "at least one answer token"),
        ([1], [VOCAB], 1.0, FP, "BAD_REQUEST", "outside the vocabulary"),
        ([1], [2], 0.0, FP, "BAD_REQUEST", "temperature"),
        ([1], [2], math.nan, FP, "BAD_REQUEST", "temperature"),
        ([1] * (CHECK_MAX_PROMPT_TOKENS + 1), [2], 1.0, FP, "TOO_LARGE", "at most"),
        ([1], [2] * (CHECK_MAX_ANSWER_TOKENS + 1), 1.0, FP, "TOO_LARGE", "at most"),
    ],
)
def test_requests_not_to_serve_get_the_right_code(prompt, answer, temperature, fingerprint, code, words):
    with pytest.raises(WireError) as info:
        decode_check_request(encode_check_request(fingerprint, prompt, answer, temperature), fingerprint=FP, vocab_size=VOCAB)
    assert info.value.code == code and words in info.value.message


def test_response_round_trip_and_refusal():
    got = decode_check_response(encode_check_response([score(4), score(5)], 17), [4, 5])
    assert [s.token_id for s in got.scores] == [4, 5] and got.evaluated_tokens == 17
    assert got.scores[0].logprob == pytest.approx(-0.5) and got.scores[1].var_logprob == pytest.approx(0.5)
    with pytest.raises(RemoteError) as info:
        decode_check_response(encode_check_error("BUSY", "later"), [4], peer="v")
    assert info.value.code == "BUSY" and info.value.peer == "v"


@pytest.mark.parametrize(
    "scores, words",
    [
        ([score(4)], "1 scores for an answer of 2"),
        ([score(4), score(6)], "of token 6"),
        ([score(4), score(5, logprob=0.5)], "not a distribution"),
        ([score(4), score(5, logprob=-0.1, best=-2.0)], "not a distribution"),
        ([score(4), score(5, var=-1.0)], "not a distribution"),
        ([score(4), score(5, mean=math.inf)], "not a distribution"),
    ],
)
def test_a_verifier_answer_that_cannot_be_real_scores_is_rejected(scores, words):
    with pytest.raises(WireError) as info:
        decode_check_response(encode_check_response(scores, 0), [4, 5])
    assert words in info.value.message


@given(st.binary(max_size=512))
@settings(max_examples=300, deadline=None)
def test_check_decoders_never_raise_anything_else(data):
    for decode in (lambda d: decode_check_request(d, fingerprint=FP, vocab_size=VOCAB), lambda d: decode_check_response(d, [4, 5])):
        try:
            decode(data)
        except (WireError, RemoteError):
            pass
