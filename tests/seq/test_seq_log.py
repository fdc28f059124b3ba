"""seq/log.py: the log format and its recovery, without files."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seq.errors import StoreCorrupt
from seq.log import HEADER, MAX_NAME, decode_log, encode_batch


def log_of(*batches: list[tuple[str, int]]) -> bytes:
    return HEADER + b"".join(encode_batch(b) for b in batches)


def test_roundtrip_keeps_the_maximum() -> None:
    data = log_of([("a", 5), ("b", 2)], [("a", 3), ("c", 9)], [("b", 7)])
    d = decode_log(data)
    assert d.values == {"a": 5, "b": 7, "c": 9}
    assert d.valid_end == len(data) and not d.torn


def test_empty_log() -> None:
    assert decode_log(HEADER).values == {}


def test_unicode_names_and_limits() -> None:
    d = decode_log(log_of([("é" * 10, 1 << 62), ("", 4)]))
    assert d.values == {"é" * 10: 1 << 62, "": 4}
    with pytest.raises(ValueError):
        encode_batch([("x" * (MAX_NAME + 1), 1)])
    with pytest.raises(ValueError):
        encode_batch([("x", 1 << 63)])


def test_every_torn_tail_is_cut_to_the_last_whole_batch() -> None:
    good = log_of([("a", 10)], [("b", 20)])
    last = encode_batch([("a", 30), ("c", 40)])
    for cut in range(len(last)):
        d = decode_log(good + last[:cut])
        assert d.values == {"a": 10, "b": 20}, cut
        assert d.valid_end == len(good)
        assert d.torn == (cut > 0)


def test_zeroed_tail_is_torn() -> None:
    good = log_of([("a", 10)])
    d = decode_log(good + b"\0" * 100)
    assert d.values == {"a": 10} and d.torn and d.valid_end == len(good)


def test_bad_checksum_on_last_batch_is_torn() -> None:
    good = log_of([("a", 10)])
    bad = bytearray(encode_batch([("a", 99)]))
    bad[-1] ^= 0xFF
    d = decode_log(good + bytes(bad))
    assert d.values == {"a": 10} and d.torn


def test_damage_before_valid_data_is_corruption() -> None:
    first = bytearray(encode_batch([("a", 10)]))
    first[-1] ^= 0xFF
    data = HEADER + bytes(first) + encode_batch([("b", 1)])
    with pytest.raises(StoreCorrupt):
        decode_log(data)


@pytest.mark.parametrize("data", [b"", b"RRSEQ", b"XXXXXXXX\x01\x00\x00\x00", b"RRSEQLOG\x02\x00\x00\x00"])
def test_bad_header(data: bytes) -> None:
    with pytest.raises(StoreCorrupt):
        decode_log(data)


def test_checksummed_but_malformed_payload_is_corruption() -> None:
    payload = struct.pack("<H", 50) + b"abc"
    crc = zlib.crc32(payload, zlib.crc32(struct.pack("<I", len(payload))))
    data = HEADER + struct.pack("<II", len(payload), crc) + payload
    with pytest.raises(StoreCorrupt):
        decode_log(data)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.lists(st.tuples(st.text(max_size=8), st.integers(0, (1 << 63) - 1)), max_size=4), max_size=5),
    st.binary(max_size=64),
)
def test_fuzz_recovery_never_loses_whole_batches(batches: list[list[tuple[str, int]]], junk: bytes) -> None:
    data = log_of(*batches)
    expect: dict[str, int] = {}
    for b in batches:
        for k, v in b:
            expect[k] = max(expect.get(k, 0), v)
    try:
        d = decode_log(data + junk)
    except StoreCorrupt:
        return  # junk that happens to form a damaged batch followed by a valid one
    for k, v in expect.items():
        assert d.values.get(k, 0) >= v  # whole batches are never lost, values never go backwards


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=256))
def test_fuzz_arbitrary_bytes_only_raise_store_corrupt(junk: bytes) -> None:
    try:
        decode_log(HEADER + junk)
    except StoreCorrupt:
        pass
