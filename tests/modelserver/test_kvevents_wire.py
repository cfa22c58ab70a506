"""vLLM's KV-event wire format, byte for byte (msgpack spec; vLLM 0.32's struct layout)."""

from __future__ import annotations

import pytest

from modelserver.kvevents import (
    END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    MalformedMessage,
    decode_batch,
    encode_batch,
    hash_to_u64,
    parse_message,
    parse_replay_reply,
    replay_request,
)


def s(text: str) -> bytes:
    """msgpack fixstr."""
    raw = text.encode()
    assert len(raw) < 32
    return bytes([0xA0 | len(raw)]) + raw


F64_1_5 = b"\xcb\x3f\xf8\x00\x00\x00\x00\x00\x00"  # float64 1.5
NIL = b"\xc0"


def batch_bytes(event: bytes, dp_rank: bytes = b"\x00") -> bytes:
    """EventBatch: fixarray(3) [ts, [event], dp_rank]."""
    return b"\x93" + F64_1_5 + b"\x91" + event + dp_rank


STORED = (
    b"\x88"  # fixmap, 8 pairs: type + the 7 fields without defaults
    + s("type") + s("BlockStored")
    + s("block_hashes") + b"\x92" + b"\xcf" + b"\xff" * 8 + b"\x07"
    + s("parent_block_hash") + b"\xcd\x01\x00"  # uint16 256
    + s("token_ids") + b"\x94\x01\x02\x03\x04"
    + s("block_size") + b"\x02"
    + s("lora_id") + NIL
    + s("medium") + s("GPU")
    + s("lora_name") + NIL
)
REMOVED = b"\x83" + s("type") + s("BlockRemoved") + s("block_hashes") + b"\x91\x05" \
    + s("medium") + s("GPU")
CLEARED = b"\x81" + s("type") + s("AllBlocksCleared")


def test_block_stored_encodes_to_vllms_bytes() -> None:
    ev = BlockStored(block_hashes=[2**64 - 1, 7], parent_block_hash=256, token_ids=[1, 2, 3, 4],
                     block_size=2, lora_id=None, medium="GPU", lora_name=None)
    assert encode_batch(EventBatch(ts=1.5, events=[ev], data_parallel_rank=0)) == \
        batch_bytes(STORED)


def test_block_removed_encodes_to_vllms_bytes() -> None:
    ev = BlockRemoved(block_hashes=[5], medium="GPU")
    assert encode_batch(EventBatch(ts=1.5, events=[ev], data_parallel_rank=0)) == \
        batch_bytes(REMOVED)


def test_all_blocks_cleared_encodes_to_vllms_bytes() -> None:
    assert encode_batch(EventBatch(ts=1.5, events=[AllBlocksCleared()], data_parallel_rank=0)) \
        == batch_bytes(CLEARED)


def test_unset_dp_rank_is_nil_and_a_two_element_batch_still_decodes() -> None:
    raw = encode_batch(EventBatch(ts=1.5, events=[AllBlocksCleared()]))
    assert raw == batch_bytes(CLEARED, dp_rank=NIL)
    # Releases before data_parallel_rank existed sent [ts, events].
    assert decode_batch(b"\x92" + F64_1_5 + b"\x91" + CLEARED).data_parallel_rank is None


def test_each_event_type_decodes_from_vllms_bytes() -> None:
    for raw, want in [
        (STORED, BlockStored(block_hashes=[2**64 - 1, 7], parent_block_hash=256,
                             token_ids=[1, 2, 3, 4], block_size=2, lora_id=None, medium="GPU",
                             lora_name=None)),
        (REMOVED, BlockRemoved(block_hashes=[5], medium="GPU")),
        (CLEARED, AllBlocksCleared()),
    ]:
        batch = decode_batch(batch_bytes(raw))
        assert batch.ts == 1.5 and batch.data_parallel_rank == 0
        assert batch.events == [want]


def test_unknown_fields_from_newer_vllm_are_ignored() -> None:
    extra = b"\x84" + REMOVED[1:] + s("future_field") + b"\x01"
    assert decode_batch(batch_bytes(extra)).events == [BlockRemoved(block_hashes=[5],
                                                                    medium="GPU")]


def test_bytes_hashes_decode_and_map_to_their_low_64_bits() -> None:
    digest = bytes(range(32))
    ev = BlockRemoved(block_hashes=[digest], medium=None)
    batch = decode_batch(encode_batch(EventBatch(ts=0.0, events=[ev])))
    (got,) = batch.events
    assert isinstance(got, BlockRemoved)
    assert hash_to_u64(got.block_hashes[0]) == int.from_bytes(digest[-8:], "big")
    assert hash_to_u64(-1) == 2**64 - 1


@pytest.mark.parametrize("payload", [
    b"",
    b"garbage that is not msgpack",
    batch_bytes(STORED)[:-5],  # truncated
    b"\x93" + F64_1_5 + b"\xdd\xff\xff\xff\xff",  # array32 header claiming 4 billion events
    b"\x93" + F64_1_5 + b"\x91" + b"\x81" + s("type") + s("NoSuchEvent") + b"\x00",
    b"\x93" + F64_1_5 + b"\x91" + b"\x82" + s("type") + s("BlockRemoved") + s("x") + b"\x01",
])
def test_hostile_payloads_raise_malformed(payload: bytes) -> None:
    with pytest.raises(MalformedMessage) as info:
        decode_batch(payload)
    assert info.value.reason == "bad_payload"


def test_oversized_payload_is_refused_unread() -> None:
    with pytest.raises(MalformedMessage) as info:
        decode_batch(b"\x00" * 100, max_bytes=99)
    assert info.value.reason == "too_large"


def test_event_with_too_many_blocks_is_refused() -> None:
    ev = BlockRemoved(block_hashes=list(range(11)), medium=None)
    with pytest.raises(MalformedMessage) as info:
        decode_batch(encode_batch(EventBatch(ts=0.0, events=[ev])), max_blocks=10)
    assert info.value.reason == "too_large"


def test_block_stored_whose_tokens_do_not_fill_its_blocks_is_refused() -> None:
    ev = BlockStored(block_hashes=[1, 2], parent_block_hash=None, token_ids=[1, 2, 3],
                     block_size=2, lora_id=None, medium=None, lora_name=None)
    with pytest.raises(MalformedMessage, match="carries 3 token ids"):
        decode_batch(encode_batch(EventBatch(ts=0.0, events=[ev])))


def test_pub_frames_parse_and_bad_frames_are_refused() -> None:
    assert parse_message([b"kv@a@m", (5).to_bytes(8, "big"), b"p"]) == (b"kv@a@m", 5, b"p")
    for frames in ([b"t", b"p"], [b"t", b"\x00" * 7, b"p"], [b"t", b"\x00" * 8, b"p", b"x"]):
        with pytest.raises(MalformedMessage) as info:
            parse_message(frames)
        assert info.value.reason == "bad_frames"


def test_replay_answers_of_both_vllm_layouts_parse() -> None:
    seq = (3).to_bytes(8, "big")
    assert replay_request(3) == [b"", seq]
    assert parse_replay_reply([b"", b"topic", seq, b"p"]) == (3, b"p")  # vLLM 0.32
    assert parse_replay_reply([b"", seq, b"p"]) == (3, b"p")  # before the topic frame
    assert parse_replay_reply([b"", b"", END_SEQ, b""]) is None
    assert END_SEQ == b"\xff" * 8
    with pytest.raises(MalformedMessage):
        parse_replay_reply([b"x", seq, b"p"])
