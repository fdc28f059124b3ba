"""Deterministic test data, the same as the Go peer's (tests/rpc/interop/go-stream):
chunk k of 64 KiB is uint64be(k) followed by bytes 8.. of a fixed block, so that
large transfers are generated and checked in pieces, never held whole."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

CHUNK = 64 << 10
_BASE = b"".join(hashlib.sha256(b"juggler-stream" + i.to_bytes(4, "big")).digest() for i in range(CHUNK // 32))


def pattern(size: int) -> Iterator[bytes]:
    """``size`` bytes of the pattern, in chunks of at most 64 KiB."""
    k = 0
    while size > 0:
        n = min(CHUNK, size)
        yield (k.to_bytes(8, "big") + _BASE[8:])[:n]
        size -= n
        k += 1


def pattern_sha256(size: int) -> str:
    h = hashlib.sha256()
    for chunk in pattern(size):
        h.update(chunk)
    return h.hexdigest()


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()
