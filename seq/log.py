"""The on-disk log format of the store, sans-I/O (bytes in, values out).

A log file is a header followed by batches; one batch is one group commit::

    header  = b"RRSEQLOG" u32le(version=1)
    batch   = u32le(len(payload)) u32le(crc32(u32le(len(payload)) payload)) payload
    payload = entry*
    entry   = u16le(len(name)) name(utf-8) u64le(value)

Each entry says "the high-water mark of `name` is at least `value`"; the
state is the per-name maximum over all entries, so replaying never moves a
value backwards. The first batch of a file written by compaction holds the
whole state.

Recovery (:func:`decode_log`): a batch that runs past the end of the file, or
whose checksum fails with nothing valid after it, is a torn tail (a write
that a crash interrupted, never acknowledged since acknowledgement follows
fsync): it is cut off. A bad batch followed by a valid one is corruption of
acknowledged data, which :class:`StoreCorrupt` reports instead of guessing.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

from seq.errors import StoreCorrupt

MAGIC = b"RRSEQLOG"
VERSION = 1
HEADER = MAGIC + struct.pack("<I", VERSION)
MAX_NAME = 256  # bytes of UTF-8
MAX_BATCH = 64 << 20  # a batch's payload, bytes (a compaction of ~250k names)
MAX_VALUE = (1 << 63) - 1

_BATCH_HEAD = struct.Struct("<II")
_NAME_LEN = struct.Struct("<H")
_VALUE = struct.Struct("<Q")


def encode_batch(entries: Iterable[tuple[str, int]]) -> bytes:
    """One batch (header + payload) for `entries` (name, value)."""
    parts: list[bytes] = []
    for name, value in entries:
        raw = name.encode()
        if len(raw) > MAX_NAME:
            raise ValueError(f"name longer than {MAX_NAME} bytes")
        if not 0 <= value <= MAX_VALUE:
            raise ValueError(f"value out of range: {value}")
        parts.append(_NAME_LEN.pack(len(raw)))
        parts.append(raw)
        parts.append(_VALUE.pack(value))
    payload = b"".join(parts)
    if len(payload) > MAX_BATCH:
        raise ValueError("batch too large")
    return _BATCH_HEAD.pack(len(payload), _crc(len(payload), payload)) + payload


def _crc(length: int, payload: bytes) -> int:
    # The length is covered too, so a zero-filled tail (length 0, crc 0) never passes as a batch.
    return zlib.crc32(payload, zlib.crc32(struct.pack("<I", length)))


def _decode_payload(payload: bytes, into: dict[str, int]) -> None:
    pos, end = 0, len(payload)
    while pos < end:
        if end - pos < _NAME_LEN.size:
            raise StoreCorrupt("entry header cut short inside a checksummed batch")
        (n,) = _NAME_LEN.unpack_from(payload, pos)
        pos += _NAME_LEN.size
        if n > MAX_NAME or end - pos < n + _VALUE.size:
            raise StoreCorrupt("entry runs past its batch")
        try:
            name = payload[pos : pos + n].decode()
        except UnicodeDecodeError as exc:
            raise StoreCorrupt("entry name is not UTF-8") from exc
        pos += n
        (value,) = _VALUE.unpack_from(payload, pos)
        pos += _VALUE.size
        if value > into.get(name, 0):
            into[name] = value


def _valid_batch_at(data: bytes, pos: int) -> bool:
    if len(data) - pos < _BATCH_HEAD.size:
        return False
    length, crc = _BATCH_HEAD.unpack_from(data, pos)
    end = pos + _BATCH_HEAD.size + length
    if length > MAX_BATCH or end > len(data):
        return False
    return _crc(length, data[pos + _BATCH_HEAD.size : end]) == crc


@dataclass(frozen=True, slots=True)
class Decoded:
    values: dict[str, int]
    valid_end: int  # offset after the last good batch: the file is cut here
    torn: bool  # a torn tail was found after valid_end


def decode_log(data: bytes) -> Decoded:
    """Replay a whole log file. Raises :class:`StoreCorrupt` on damage that is not a torn tail."""
    if len(data) < len(HEADER):
        # A file shorter than its header was never renamed into place by us
        # (files are created complete, then renamed), so it is damage.
        raise StoreCorrupt("log shorter than its header")
    if data[: len(MAGIC)] != MAGIC:
        raise StoreCorrupt("not a seq log (bad magic)")
    (version,) = struct.unpack_from("<I", data, len(MAGIC))
    if version != VERSION:
        raise StoreCorrupt(f"unsupported log version {version}")
    values: dict[str, int] = {}
    pos, size = len(HEADER), len(data)
    while pos < size:
        if size - pos < _BATCH_HEAD.size:
            return Decoded(values, pos, True)
        length, crc = _BATCH_HEAD.unpack_from(data, pos)
        end = pos + _BATCH_HEAD.size + length
        if end > size:
            return Decoded(values, pos, True)
        payload = data[pos + _BATCH_HEAD.size : end]
        if length > MAX_BATCH or _crc(length, payload) != crc:
            if length <= MAX_BATCH and _valid_batch_at(data, end):
                raise StoreCorrupt(f"damaged batch at offset {pos} followed by valid data")
            return Decoded(values, pos, True)
        _decode_payload(payload, values)
        pos = end
    return Decoded(values, pos, False)
