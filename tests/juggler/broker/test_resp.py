"""The thin RESP client: encoding, URL parsing, pipelining, cancellation
safety and dead-connection detection, against a real redis-server."""

from __future__ import annotations

import asyncio

import pytest

from juggler.broker.resp import (
    RedisAddress,
    RedisConnectionError,
    RedisReplyError,
    RespConnection,
    RespPool,
    pack_command,
)
from tests.netutil import wait_until

pytestmark = pytest.mark.timeout(30)


def test_pack_command() -> None:
    assert pack_command(("SET", b"k", 5)) == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\n5\r\n"
    assert pack_command(("ECHO", "é")) == b"*2\r\n$4\r\nECHO\r\n$2\r\n\xc3\xa9\r\n"
    with pytest.raises(TypeError):
        pack_command(("X", object()))  # type: ignore[arg-type]


def test_address_from_url() -> None:
    a = RedisAddress.from_url("redis://user:p%40ss@10.0.0.5:6380/3")
    assert (a.host, a.port, a.db, a.username, a.password) == ("10.0.0.5", 6380, 3, "user", "p@ss")
    assert RedisAddress.from_url("redis://127.0.0.1") == RedisAddress()
    assert RedisAddress.from_url("unix:///tmp/r.sock?db=2").unix_path == "/tmp/r.sock"
    with pytest.raises(ValueError):
        RedisAddress.from_url("http://x")


async def test_pipelining_errors_and_db(redis_url: str) -> None:
    conn = await RespConnection.open(RedisAddress.from_url(redis_url.rsplit("/", 1)[0] + "/2"))
    try:
        futs = [conn.execute("SET", f"k{i}", i) for i in range(100)] + [conn.execute("GET", "k42")]
        replies = await asyncio.gather(*futs)
        assert replies[-1] == b"42"
        with pytest.raises(RedisReplyError, match="unknown command"):
            await conn.execute("NOSUCHCOMMAND")
        assert await conn.execute("CLIENT", "INFO") is not None
        info = await conn.execute("CLIENT", "INFO")
        assert b" db=2 " in info
    finally:
        conn.close()


async def test_a_cancelled_waiter_does_not_shift_replies(redis_url: str) -> None:
    conn = await RespConnection.open(RedisAddress.from_url(redis_url))
    try:
        await conn.execute("SET", "a", "A")
        await conn.execute("SET", "b", "B")
        slow = asyncio.ensure_future(conn.execute("BLPOP", "nothing", 0.2, timeout=5))
        await wait_until(lambda: conn._pending, interval=0, what="BLPOP sent")
        slow.cancel()
        # the BLPOP reply still arrives and is dropped; this one gets its own
        assert await conn.execute("GET", "a") == b"A"
        assert await conn.execute("GET", "b") == b"B"
    finally:
        conn.close()


async def test_no_reply_in_time_closes_the_connection(redis_url: str) -> None:
    conn = await RespConnection.open(RedisAddress.from_url(redis_url), command_timeout=0.3)
    fut = conn.execute("BLPOP", "never", 0)  # blocks forever: longer than command_timeout
    with pytest.raises(RedisConnectionError):
        await asyncio.wait_for(fut, 10)
    assert conn.closed
    with pytest.raises(RedisConnectionError):
        await conn.execute("PING")


async def test_pool_replaces_dead_connections(redis_url: str) -> None:
    pool = RespPool(RedisAddress.from_url(redis_url), size=2)
    try:
        assert await pool.execute("PING") == b"PONG"
        (await pool.connection()).close()
        assert await pool.execute("PING") == b"PONG"
    finally:
        await pool.aclose()
    with pytest.raises(RedisConnectionError):
        await pool.execute("PING")


async def test_connect_refused() -> None:
    from tests.netutil import free_port

    with pytest.raises(RedisConnectionError):
        await RespConnection.open(RedisAddress(port=free_port()), connect_timeout=2)
