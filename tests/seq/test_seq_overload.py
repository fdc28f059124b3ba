"""A member under far more NextID calls than it lets wait (``--max-pending``):
the excess is refused at once with RESOURCE_EXHAUSTED instead of timing out,
what is admitted is served, no ID is handed out twice, the buffered client
backs off and gets its IDs, and the member serves normally as soon as the
burst is over."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from seq import RRSeq
from seq._proto import rrseq_pb2 as pb
from seq.wire import ApiStub

pytestmark = pytest.mark.asyncio


async def test_the_excess_is_refused_at_once_and_the_member_recovers(make_cluster) -> None:  # type: ignore[no-untyped-def]
    cluster = await make_cluster("--max-pending", "4")
    target = cluster.addrs[0]
    async with grpc.aio.insecure_channel(target) as ch:
        stub = ApiStub(ch)
        await stub.NextID(pb.NextIDRequest(name="warm", range_size=1), timeout=10)

        async def one(i: int) -> tuple[str, tuple[int, int, int] | None, float]:
            t0 = time.monotonic()
            try:
                r = await stub.NextID(pb.NextIDRequest(name=f"burst{i % 3}", range_size=1), timeout=20)
                return "ok", (i % 3, r.from_id, r.to_id), time.monotonic() - t0
            except grpc.aio.AioRpcError as exc:
                return exc.code().name, None, time.monotonic() - t0

        async with asyncio.timeout(60):
            results = await asyncio.gather(*(one(i) for i in range(400)))
        codes = [r[0] for r in results]
        assert set(codes) <= {"ok", "RESOURCE_EXHAUSTED"}, sorted(set(codes))
        assert codes.count("RESOURCE_EXHAUSTED") > 0, "400 calls at once, 4 may wait: some must be refused"
        assert codes.count("ok") >= 4
        ranges = [r[1] for r in results if r[1] is not None]
        assert all(lo > 0 and hi == lo + 1 for _, lo, hi in ranges), "a call admitted got no range"
        assert len({(name, lo) for name, lo, _ in ranges}) == len(ranges), "an ID handed out twice"
        # a refusal is an answer, not a wait: none took anywhere near the 20 s deadline
        refused_after = [r[2] for r in results if r[0] == "RESOURCE_EXHAUSTED"]
        assert max(refused_after) < 15, f"a refusal took {max(refused_after):.1f}s"
        # the burst is over: the member serves again at once
        t0 = time.monotonic()
        r = await stub.NextID(pb.NextIDRequest(name="after", range_size=5), timeout=10)
        assert r.to_id - r.from_id == 5
        assert time.monotonic() - t0 < 5


async def test_the_buffered_client_backs_off_and_gets_its_ids(make_cluster) -> None:  # type: ignore[no-untyped-def]
    cluster = await make_cluster("--max-pending", "2")
    async with RRSeq("clients", 0, cluster.addrs, timeout=20, backoff_min=0.01, backoff_max=0.2) as seq:
        async with asyncio.timeout(60):
            ids = await asyncio.gather(*(seq.next() for _ in range(300)))
    assert len(set(ids)) == 300


async def test_max_pending_is_checked(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from seq.startup import ServerConfig

    with pytest.raises(ValueError, match="max_pending"):
        ServerConfig(listen="127.0.0.1:1", data_dir=str(tmp_path), max_pending=0)


async def test_the_http_api_answers_the_excess_with_503_overloaded(tmp_path_factory) -> None:  # type: ignore[no-untyped-def]
    import aiohttp

    from seq.localcluster import LocalCluster

    cluster = LocalCluster(3, root=str(tmp_path_factory.mktemp("seq")), http=True)
    cluster.start_all("--bootstrap", "--max-pending", "3")
    try:
        await cluster.wait_ready(timeout=60)
        url = cluster.http_urls[0]
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            async def one(i: int) -> tuple[int, str]:
                async with http.get(f"{url}/v1/next/web{i % 2}", timeout=aiohttp.ClientTimeout(total=30)) as r:
                    body = await r.json()
                    return r.status, body.get("error", {}).get("code", "")

            async with asyncio.timeout(60):
                results = await asyncio.gather(*(one(i) for i in range(200)))
            assert {r for r in results if r[0] != 200} <= {(503, "overloaded")}, set(results)
            assert (503, "overloaded") in results and any(r[0] == 200 for r in results)
            async with http.get(f"{url}/v1/next/after?count=3") as r:
                assert r.status == 200
    finally:
        cluster.close()
