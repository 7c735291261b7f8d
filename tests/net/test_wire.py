"""The wire codecs: round trips, and a precise error for every bad input."""

from __future__ import annotations

import struct

from hypothesis import given, settings, strategies as st
import pytest

from p2pinfer.core.digest import Digest, encode_digest
from p2pinfer.core.peers import Load
from p2pinfer.engines.base import GenerationParams, GenerationRecord, TokenChunk, TokenLogprob
from p2pinfer.net.proto import p2pinfer_pb2 as pb
from p2pinfer.net.wire import (
    GOSSIP_MAX_BYTES,
    ChatLine,
    Done,
    GossipRejected,
    LoadInfo,
    RemoteError,
    WireError,
    decode_gossip,
    decode_pull_response,
    decode_request,
    decode_response,
    encode_chunk,
    encode_done,
    encode_error,
    encode_gossip_digest,
    encode_gossip_load,
    encode_pull_error,
    encode_pull_response,
    encode_request,
    load_to_pb,
)

FP = "0123456789abcdef"
ME = "12D3KooWMe"
PEER = "12D3KooWPeer"


def request(**changes):
    fields = dict(
        request_id=b"r" * 16,
        tokens=[300, 301, 302],
        params=GenerationParams(max_tokens=5, temperature=0.7, seed=3, stop=("\n",)),
        hops=1,
        deadline_ms=1500,
        fingerprint=FP,
        predicted_match_tokens=16,
        origin=PEER,
    )
    fields.update(changes)
    return encode_request(**fields)


def test_request_round_trip():
    req = decode_request(request(), fingerprint=FP, max_hops=1, max_tokens=100)
    assert req.tokens == [300, 301, 302]
    assert req.params == GenerationParams(max_tokens=5, temperature=0.7, seed=3, stop=("\n",))
    assert (req.hops, req.deadline_ms, req.predicted_match_tokens, req.origin) == (1, 1500, 16, PEER)


@pytest.mark.parametrize(
    ("data", "code", "words"),
    [
        (b"\xff\xff\xff", "BAD_REQUEST", "not a GenerateRequest"),
        (request(fingerprint="f" * 16), "MODEL_MISMATCH", "fingerprint"),
        (request(hops=2), "HOP_LIMIT", "2 hops"),
        (request(hops=0), "HOP_LIMIT", "0 hops"),
        (request(tokens=[1] * 101), "TOO_LARGE", "101 prompt tokens"),
        (request(request_id=b""), "BAD_REQUEST", "request_id"),
        (request(resumed_tokens=9), "BAD_REQUEST", "resumed_tokens"),
        (pb.GenerateRequest(version=1).SerializeToString(), "BAD_REQUEST", "version 1; this node speaks 2"),
        (pb.GenerateRequest(version=2, request_id=b"x", hops=1, model_fingerprint=FP).SerializeToString(), "BAD_REQUEST", "parameters are missing"),
    ],
)
def test_bad_requests_get_the_right_code(data, code, words):
    with pytest.raises(WireError) as info:
        decode_request(data, fingerprint=FP, max_hops=1, max_tokens=100)
    assert info.value.code == code
    assert words in info.value.message


def test_impossible_parameters_are_bad_requests():
    msg = pb.GenerateRequest()
    msg.ParseFromString(request())
    msg.params.top_p = float("nan")
    with pytest.raises(WireError, match="top_p"):
        decode_request(msg.SerializeToString(), fingerprint=FP, max_hops=1, max_tokens=100)
    msg.params.top_p = 1.0
    msg.params.max_tokens = 0
    with pytest.raises(WireError, match="max_tokens"):
        decode_request(msg.SerializeToString(), fingerprint=FP, max_hops=1, max_tokens=100)


def test_response_round_trip():
    chunk = decode_response(encode_chunk(TokenChunk((5, 6), "ab")))
    assert chunk == TokenChunk((5, 6), "ab")
    record = GenerationRecord(10, 8, 2, 0.01, 0.02, "length", 0.001)
    done = decode_response(encode_done(record, ME))
    assert isinstance(done, Done) and done.record == record and done.served_by == ME
    err = decode_response(encode_error("BUSY", "queue full"), PEER)
    assert isinstance(err, RemoteError) and (err.code, err.message, err.peer) == ("BUSY", "queue full", PEER)


def test_the_final_record_carries_no_reply_save_time_and_ignores_an_old_nodes():
    # The reply is saved after the record is sent (issue 18): field 9, reply_save_s, is reserved.
    # An older node still sends it (double, field 9): the done decodes, the field is ignored.
    assert "reply_save_s" not in pb.GenerateDone.DESCRIPTOR.fields_by_name
    record = GenerationRecord(10, 8, 2, 0.01, 0.02, "stop", 0.001, extra={"reply_save_tokens": 40, "slot": 1})
    encoded = encode_done(record, ME)
    done = decode_response(encoded)
    assert isinstance(done, Done) and done.record.extra == {}
    old_field_9 = bytes([(9 << 3) | 1]) + struct.pack("<d", -1.0)  # even a value that was invalid then
    msg = pb.GenerateResponse()
    msg.ParseFromString(encoded)
    msg.done.MergeFromString(old_field_9)
    done = decode_response(msg.SerializeToString())
    assert isinstance(done, Done) and done.record == GenerationRecord(10, 8, 2, 0.01, 0.02, "stop", 0.001)
    bad = pb.GenerateResponse(version=2, done=pb.GenerateDone(ttft_s=-1.0, finish_reason="stop"))
    with pytest.raises(WireError, match="timings"):
        decode_response(bad.SerializeToString())


def test_lying_final_records_are_rejected():
    bad = pb.GenerateResponse(version=2, done=pb.GenerateDone(prompt_tokens=4, reused_tokens=9, finish_reason="stop"))
    with pytest.raises(WireError, match="reused_tokens"):
        decode_response(bad.SerializeToString())
    bad = pb.GenerateResponse(version=2, done=pb.GenerateDone(ttft_s=float("inf"), finish_reason="stop"))
    with pytest.raises(WireError, match="timings"):
        decode_response(bad.SerializeToString())
    with pytest.raises(WireError, match="empty"):
        decode_response(pb.GenerateResponse(version=2).SerializeToString())


def digest(node=PEER, fp=FP, version=3):
    return Digest("full", node, fp, version, 0, frozenset({1, 2, 3}), epoch=9)


def test_gossip_digest_and_load_round_trip():
    got = decode_gossip(encode_gossip_digest(encode_digest(digest())), sender=PEER, fingerprint=FP)
    assert got == digest()
    report = load_to_pb(PEER, FP, Load(120, 4.35, 2), True, 9, 3, ["/ip4/127.0.0.1/tcp/4001"])
    info = decode_gossip(encode_gossip_load(report), sender=PEER, fingerprint=FP)
    assert isinstance(info, LoadInfo)
    assert info.busy and info.epoch == 9 and info.digest_version == 3
    assert info.load.queued_prefill_tokens == 120 and info.load.active_requests == 2
    assert info.addrs == ("/ip4/127.0.0.1/tcp/4001",)
    assert (info.load.slots, info.load.free_slots, info.load.slot_wait_ms) == (1, 1, 0.0)


def test_load_reports_carry_slots_and_read_a_report_without_them_as_one_slot():
    sent = Load(300, 4.0, 9, slots=8, free_slots=0, slot_wait_ms=1250.0)
    info = decode_gossip(encode_gossip_load(load_to_pb(PEER, FP, sent, False, 1, 1, [])), sender=PEER, fingerprint=FP)
    assert info.load == sent
    old = pb.LoadReport(node_id=PEER, model_fingerprint=FP, queued_prefill_tokens=5, prefill_ms_per_token=4.0,
                        active_requests=1, epoch=1)  # what a node from before continuous batching sends
    info = decode_gossip(encode_gossip_load(old), sender=PEER, fingerprint=FP)
    assert (info.load.slots, info.load.free_slots, info.load.slot_wait_ms) == (1, 0, 0.0)


def test_load_reports_say_whether_the_speed_is_measured_and_read_an_older_report_as_measured():
    for measured in (True, False):
        sent = Load(0, 4.58, 0, speed_measured=measured)
        info = decode_gossip(encode_gossip_load(load_to_pb(PEER, FP, sent, False, 1, 1, [])), sender=PEER, fingerprint=FP)
        assert info.load.speed_measured is measured
    old = pb.LoadReport(node_id=PEER, model_fingerprint=FP, prefill_ms_per_token=9.0, slots=1, free_slots=1, epoch=1)
    info = decode_gossip(encode_gossip_load(old), sender=PEER, fingerprint=FP)
    assert info.load.speed_measured  # a node from before issue 23 reported only what it had


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"\xff" * 10, "malformed"),
        (encode_gossip_digest(b"\xa0"), "malformed"),
        (encode_gossip_digest(encode_digest(digest(node=ME))), "spoofed"),
        (encode_gossip_digest(encode_digest(digest(fp="f" * 16))), "other-model"),
        (encode_gossip_load(load_to_pb(ME, FP, Load(), False, 1, 1, [])), "spoofed"),
        (encode_gossip_load(load_to_pb(PEER, "e" * 16, Load(), False, 1, 1, [])), "other-model"),
        (encode_gossip_load(load_to_pb(PEER, FP, Load(0, float("nan"), 0), False, 1, 1, [])), "malformed"),
        (encode_gossip_load(load_to_pb(PEER, FP, Load(), False, 1, 1, ["not-a-multiaddr"])), "malformed"),
        (encode_gossip_load(pb.LoadReport(node_id=PEER, model_fingerprint=FP, slots=2, free_slots=3)), "malformed"),
        (encode_gossip_load(pb.LoadReport(node_id=PEER, model_fingerprint=FP, slots=5000)), "malformed"),
        (encode_gossip_load(pb.LoadReport(node_id=PEER, model_fingerprint=FP, slot_wait_ms=float("inf"))), "malformed"),
        (encode_gossip_load(pb.LoadReport(node_id=PEER, model_fingerprint=FP, slot_wait_ms=-1.0)), "malformed"),
        (pb.GossipMessage(version=2, digest=b"").SerializeToString(), "version"),
        (pb.GossipMessage(version=1).SerializeToString(), "malformed"),
        (b"\x00" * (GOSSIP_MAX_BYTES + 1), "oversized"),
    ],
)
def test_gossip_validator_reasons(payload, reason):
    with pytest.raises(GossipRejected) as info:
        decode_gossip(payload, sender=PEER, fingerprint=FP)
    assert info.value.reason == reason


@given(st.binary(max_size=512))
@settings(max_examples=300, deadline=None)
def test_gossip_decoder_never_raises_anything_else(data):
    try:
        decode_gossip(data, sender=PEER, fingerprint=FP)
    except GossipRejected:
        pass


@given(st.binary(max_size=512))
@settings(max_examples=300, deadline=None)
def test_request_and_response_decoders_never_raise_anything_else(data):
    for decode in (
        lambda d: decode_request(d, fingerprint=FP, max_hops=1, max_tokens=100),
        lambda d: decode_response(d),
    ):
        try:
            decode(data)
        except WireError:
            pass


def test_pull_response_accepts_only_the_responders_own_digest():
    load = load_to_pb(PEER, FP, Load(), False, 9, 3, [])
    peers = [("12D3KooWOther", ["/ip4/10.0.0.2/tcp/4001"]), ("x", ["no-slash"])]
    got = decode_pull_response(encode_pull_response(encode_digest(digest()), load, peers), sender=PEER, fingerprint=FP)
    assert got.digest == digest() and got.load is not None
    assert got.peers == (("12D3KooWOther", ("/ip4/10.0.0.2/tcp/4001",)),)  # the address-less record is dropped
    forged = encode_pull_response(encode_digest(digest(node="12D3KooWOther")), load, [])
    with pytest.raises(GossipRejected, match="spoofed"):
        decode_pull_response(forged, sender=PEER, fingerprint=FP)
    with pytest.raises(RemoteError) as info:
        decode_pull_response(encode_pull_error("MODEL_MISMATCH", "other model"), sender=PEER, fingerprint=FP)
    assert info.value.code == "MODEL_MISMATCH"


def test_version_2_fields_round_trip():
    params = GenerationParams(max_tokens=5, presence_penalty=0.5, frequency_penalty=-1.0, repetition_penalty=1.3,
                              grammar='root ::= "a"', logprobs=True, top_logprobs=3, seed=9)
    req = decode_request(request(params=params), fingerprint=FP, max_hops=1, max_tokens=100)
    assert req.params == params and not req.delegated


def test_delegated_request_carries_text_or_messages_and_tools():
    text = decode_request(request(tokens=(), prompt_text="hello"), fingerprint=FP, max_hops=1, max_tokens=100)
    assert text.delegated and text.prompt_text == "hello" and text.tokens == []
    chat = decode_request(
        request(tokens=(), messages=(ChatLine("user", "hi"),), tools_json='[{"type":"function"}]'),
        fingerprint=FP, max_hops=1, max_tokens=100,
    )
    assert chat.messages == (ChatLine("user", "hi"),) and chat.tools_json.startswith("[")
    for fields, words in [
        (dict(prompt_text="x"), "exactly one of"),  # tokens and text
        (dict(tokens=()), "exactly one of"),  # nothing at all
        (dict(tokens=(), prompt_text="x", tools_json="[]"), "tools_json needs messages"),
    ]:
        with pytest.raises(WireError) as info:
            decode_request(request(**fields), fingerprint=FP, max_hops=1, max_tokens=100)
        assert info.value.code == "BAD_REQUEST" and words in info.value.message


def test_logprobs_travel_with_their_chunk_and_are_checked():
    lp = TokenLogprob(7, b"ab", -0.25, ((7, b"ab", -0.25), (9, b"\xe2", -2.0)))
    back = decode_response(encode_chunk(TokenChunk((7,), "ab", (lp,))))
    assert back.logprobs[0].token_id == 7 and back.logprobs[0].top[1][:2] == (9, b"\xe2")
    assert back.logprobs[0].logprob == pytest.approx(-0.25)
    for bad in (
        TokenChunk((7, 8), "ab", (lp,)),  # not one per token
        TokenChunk((8,), "ab", (lp,)),  # another token's
        TokenChunk((7,), "ab", (TokenLogprob(7, b"a", 0.5),)),  # a probability above 1
    ):
        with pytest.raises(WireError):
            decode_response(encode_chunk(bad))
