"""rustext FrameDecoder: chunking, limits before buffering, shapes (incl. rpcx), fuzzing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rustext
from rustext import FrameDecoder


def test_plain_prefix_roundtrip() -> None:
    d = FrameDecoder()
    wire = d.encode_many([b"a", b"", b"hello"])
    assert wire == b"\0\0\0\x01a\0\0\0\0\0\0\0\x05hello"
    assert d.feed(wire) == [b"a", b"", b"hello"]
    assert d.buffered == 0


def test_accepts_any_buffer_type() -> None:
    d = FrameDecoder()
    wire = d.encode(memoryview(b"xyz"))
    assert d.feed(bytearray(wire[:3])) == []
    assert d.feed(memoryview(wire)[3:]) == [b"xyz"]


def test_oversized_length_fails_before_buffering() -> None:
    d = FrameDecoder(max_frame=10)
    with pytest.raises(rustext.FrameTooLarge):
        d.feed(b"\0\0\0\x0b")
    assert d.failed and d.buffered == 0
    with pytest.raises(rustext.FrameTooLarge):
        d.feed(b"")
    with pytest.raises(rustext.FrameTooLarge):
        FrameDecoder(max_frame=3).encode(b"abcd")


@pytest.mark.parametrize("width", [1, 2, 4, 8])
@pytest.mark.parametrize("endian", ["big", "little"])
def test_widths_and_endians(width: int, endian: str) -> None:
    d = FrameDecoder(width=width, endian=endian)
    frame = d.encode(b"abc")
    assert len(frame) == width + 3
    assert int.from_bytes(frame[:width], endian) == 3
    assert d.feed(frame * 2) == [b"abc", b"abc"]


def test_rpcx_shape_offset_12(shared_dir: str) -> None:
    import json
    import os

    with open(os.path.join(shared_dir, "vectors", "rpcx", "frames.json")) as f:
        frames = [bytes.fromhex(c["frame_hex"]) for c in json.load(f) if c["kind"] == "valid"]
    d = FrameDecoder(offset=12, width=4, strip_header=False)
    got: list[bytes] = []
    wire = b"".join(frames)
    for i in range(0, len(wire), 1000):
        got += d.feed(wire[i : i + 1000])
    assert got == frames


def test_encode_header_checked() -> None:
    d = FrameDecoder(offset=2)
    assert d.encode(b"z", header=b"hd") == b"hd\0\0\0\x01z"
    with pytest.raises(ValueError):
        d.encode(b"z")
    with pytest.raises(ValueError):
        FrameDecoder(width=3)
    with pytest.raises(ValueError):
        FrameDecoder(endian="middle")  # type: ignore[arg-type]


def test_negative_adjusted_length_rejected() -> None:
    d = FrameDecoder(adjust=-10)
    with pytest.raises(rustext.DecodeError):
        d.feed(b"\0\0\0\x01")


@given(
    st.lists(st.binary(max_size=200), max_size=20),
    st.lists(st.integers(0, 5000), max_size=20),
    st.sampled_from([1, 2, 4, 8]),
    st.sampled_from(["big", "little"]),
)
@settings(max_examples=200, deadline=None)
def test_any_chunking_gives_same_frames(bodies: list[bytes], cuts: list[int], width: int, endian: str) -> None:
    enc = FrameDecoder(width=width, endian=endian, max_frame=255)
    wire = b"".join(enc.encode(b) for b in bodies)
    points = sorted({0, len(wire), *(min(c, len(wire)) for c in cuts)})
    dec = FrameDecoder(width=width, endian=endian, max_frame=255)
    got: list[bytes] = []
    for a, b in zip(points, points[1:]):
        got += dec.feed(wire[a:b])
    assert got == bodies
    assert dec.buffered == 0


@given(st.binary(max_size=3000), st.integers(1, 100))
@settings(max_examples=200, deadline=None)
def test_random_bytes_bounded(data: bytes, chunk: int) -> None:
    d = FrameDecoder(max_frame=64)
    for i in range(0, len(data), chunk):
        try:
            d.feed(data[i : i + chunk])
        except rustext.DecodeError:
            break
        assert d.buffered <= 4 + 64
