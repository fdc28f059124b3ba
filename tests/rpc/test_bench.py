"""The benchmark engine: percentiles, load driver, merge, report."""

from __future__ import annotations

import asyncio

import pytest

from rpc.bench import BenchResult, BenchTarget, bench_target, format_report, percentile, run_load
from rpc.examples import benchmark_request
from rpc.message import SerializeType


def test_percentile_nearest_rank() -> None:
    values = list(range(1, 1001))
    assert percentile(values, 50) == 500 and percentile(values, 99) == 990
    assert percentile(values, 99.9) == 999 and percentile(values, 100) == 1000 and percentile(values, 0) == 1
    assert percentile([7], 99.9) == 7
    with pytest.raises(ValueError):
        percentile([], 50)


async def test_run_load_counts_and_errors() -> None:
    calls = 0

    async def call() -> None:
        nonlocal calls
        calls += 1
        n = calls
        await asyncio.sleep(0)
        if n % 10 == 0:
            raise RuntimeError("injected")

    r = await run_load(call, concurrency=8, total=100)
    assert calls == 100 and r.sent == 100 and r.ok == 90 and r.errors == 10
    assert len(r.latencies_ns) == 90 and r.first_error == "RuntimeError: injected"
    other = BenchResult(sent=5, ok=5, elapsed=r.elapsed / 2)
    other.latencies_ns.extend([1, 2, 3, 4, 5])
    r.merge(other)
    assert r.sent == 105 and r.ok == 95 and len(r.latencies_ns) == 95
    text = format_report(r, concurrency=8)
    assert "sent     requests    : 105" in text and "received requests_OK : 95" in text


async def test_bench_target_in_process() -> None:
    target = BenchTarget("inproc:bench", "Hello", "Say", SerializeType.PROTOBUF,
                         benchmark_request().SerializeToString())
    r = await bench_target(target, concurrency=10, total=500)
    assert r.ok == 500 and r.errors == 0 and r.tps > 0
    bad = BenchTarget("inproc:bench", "Hello", "Nope", SerializeType.PROTOBUF, b"")
    r = await bench_target(bad, concurrency=2, total=4)
    assert r.errors == 4 and "can't find method" in r.first_error
