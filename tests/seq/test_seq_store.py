"""seq/store.py: the durable store on real files."""

from __future__ import annotations

import asyncio
import os

import pytest

from seq.errors import StoreCorrupt, StoreError
from seq.log import encode_batch
from seq.store import Meta, Store, log_generations, read_meta, write_meta


async def opened(path: str, **kw: object) -> Store:
    s = Store.open(path, create=True, **kw)  # type: ignore[arg-type]
    s.start()
    return s


async def test_cas_semantics_and_reload(tmp_path) -> None:
    d = str(tmp_path / "d")
    s = await opened(d)
    assert s.get("x") == 1
    ok, cur, fut = s.cas("x", 1, 11)
    assert ok and cur == 11
    await fut
    assert s.cas("x", 10, 20)[:2] == (False, 11)  # stored 11 > expected 10
    ok, cur, fut = s.cas("x", 11, 12)
    assert ok
    await fut
    assert s.cas("x", 12, 12)[0] is False  # never a no-op or backwards move
    ok, fut2 = s.advance("y", 100)
    assert ok
    await fut2
    assert s.advance("y", 100)[0] is False
    await s.aclose()
    s2 = await opened(d)
    assert s2.get("x") == 12 and s2.get("y") == 100
    await s2.aclose()


async def test_concurrent_writes_share_fsyncs(tmp_path) -> None:
    s = await opened(str(tmp_path))
    futs = []
    for i in range(200):
        ok, _, fut = s.cas(f"n{i}", 1, 2)
        assert ok
        futs.append(fut)
    await asyncio.gather(*futs)
    assert s.writes == 200
    assert s.fsyncs < 200  # group commit: one fsync per batch, not per write
    await s.aclose()


async def test_compaction_keeps_values_and_one_generation(tmp_path) -> None:
    d = str(tmp_path)
    s = await opened(d, compact_bytes=512)
    for i in range(300):
        ok, _, fut = s.cas(f"k{i % 7}", s.get(f"k{i % 7}"), s.get(f"k{i % 7}") + 1 + i)
        assert ok
        await fut
    expect = s.snapshot()
    await s.aclose()
    gens = log_generations(d)
    assert len(gens) == 1 and gens[0] > 1
    s2 = await opened(d)
    assert s2.snapshot() == expect
    await s2.aclose()


async def test_torn_tail_on_disk_is_cut_and_appends_continue(tmp_path) -> None:
    d = str(tmp_path)
    s = await opened(d)
    ok, _, fut = s.cas("a", 1, 50)
    await fut
    await s.aclose()
    path = os.path.join(d, f"log.{log_generations(d)[-1]:08d}")
    size = os.path.getsize(path)
    with open(path, "ab") as f:
        f.write(encode_batch([("a", 999)])[:-3])  # a crash in the middle of a write
    s2 = await opened(d)
    assert s2.get("a") == 50
    assert os.path.getsize(path) == size
    ok, _, fut = s2.cas("a", 50, 60)
    await fut
    await s2.aclose()
    s3 = await opened(d)
    assert s3.get("a") == 60
    await s3.aclose()


async def test_corruption_before_valid_data_refuses(tmp_path) -> None:
    d = str(tmp_path)
    s = await opened(d)
    for v in (10, 20):
        ok, _, fut = s.cas("a", s.get("a"), v)
        await fut
    await s.aclose()
    path = os.path.join(d, f"log.{log_generations(d)[-1]:08d}")
    with open(path, "r+b") as f:
        f.seek(12 + 8)  # inside the first batch's payload
        f.write(b"\xff")
    with pytest.raises(StoreCorrupt):
        Store.open(d, create=False)


async def test_missing_log_without_create(tmp_path) -> None:
    with pytest.raises(StoreCorrupt):
        Store.open(str(tmp_path), create=False)


async def test_leftover_temp_files_are_removed(tmp_path) -> None:
    d = str(tmp_path)
    s = await opened(d)
    await s.aclose()
    open(os.path.join(d, "log.00000009.tmp"), "wb").close()
    s2 = await opened(d)
    assert not os.path.exists(os.path.join(d, "log.00000009.tmp"))
    assert log_generations(d) == [1]
    await s2.aclose()


async def test_write_failure_poisons_the_store(tmp_path) -> None:
    s = await opened(str(tmp_path))
    os.close(s._fd)  # the next write fails with EBADF
    s._fd = os.open(os.devnull, os.O_RDONLY)
    ok, _, fut = s.cas("a", 1, 2)
    with pytest.raises(StoreError):
        await fut
    with pytest.raises(StoreError):
        s.cas("a", 2, 3)
    await s.aclose()


def test_meta_roundtrip(tmp_path) -> None:
    d = str(tmp_path / "m")
    assert read_meta(d) is None
    write_meta(d, Meta(state="ready", cluster="abc"))
    assert read_meta(d) == Meta(state="ready", cluster="abc")
    with open(os.path.join(d, "meta.json"), "w") as f:
        f.write("{not json")
    with pytest.raises(StoreCorrupt):
        read_meta(d)


async def test_names_page_keeps_the_order_as_names_come(tmp_path) -> None:
    s = await opened(str(tmp_path / "d"))
    for name in ("m", "c", "x"):
        await s.advance(name, 5)[1]
    assert s.names_page(None, 10) == ["c", "m", "x"]  # sorted at the first listing
    await s.advance("a", 2)[1]  # new names after it, through each write path
    await s.cas("p", 1, 3)[2]
    await s.merge({"d": 9, "m": 7})
    assert s.names_page(None, 10) == ["a", "c", "d", "m", "p", "x"]
    assert s.names_page("c", 2) == ["d", "m"] and s.names_page("cz", 10) == ["d", "m", "p", "x"]
    assert s.names_page("x", 10) == []
    many = {f"n{i:05d}": 2 for i in range(1500)}  # a large catch-up: sorted again at the next listing
    await s.merge(many)
    page = s.names_page("m", 1600)
    assert page == sorted([*many, "p", "x"]) and len(s) == 1506
    await s.aclose()
