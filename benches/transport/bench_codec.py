"""Micro-benchmarks of the native codecs the transport runs on (pytest-benchmark).

    .venv/bin/python -m pytest benches/transport/bench_codec.py --benchmark-only -q

Batch decode is the transport's read path (one call per read buffer); the
per-message figures are the call-per-message alternative it avoids.
"""

from __future__ import annotations

from typing import Any

import rustext

N = 64
REQ = rustext.RpcxMessage(seq=7, service_path="Echo", service_method="Echo", serialize_type=0, payload=b"x" * 4096)
FRAME = REQ.encode()
BATCH = FRAME * N


def test_rpcx_decode_batch_64x4k(benchmark: Any) -> None:
    stream = rustext.RpcxStream()
    out = benchmark(stream.feed, BATCH)
    assert len(out) == N


def test_rpcx_decode_one_by_one_64x4k(benchmark: Any) -> None:
    frames = [FRAME] * N

    def run() -> int:
        return len([rustext.decode_rpcx(f) for f in frames])

    assert benchmark(run) == N


def test_rpcx_encode_replies_batch_64x4k(benchmark: Any) -> None:
    items = [(REQ, REQ.payload)] * N
    assert len(benchmark(rustext.encode_rpcx_replies, items)) == len(FRAME) * N


def test_rpcx_encode_request_4k(benchmark: Any) -> None:
    assert benchmark(REQ.encode) == FRAME


def test_frame_split_batch_64x4k(benchmark: Any) -> None:
    d = rustext.FrameDecoder()
    wire = d.encode_many([b"y" * 4096] * N)
    assert len(benchmark(d.feed, wire)) == N


def test_deadline_heap_add_cancel(benchmark: Any) -> None:
    h = rustext.DeadlineHeap()
    for i in range(10_000):
        h.add(i, i)

    def run() -> None:
        h.cancel(h.add(5_000, None))

    benchmark(run)
