"""juggler on one Redis under two faults the in-process fault run does not
make: a bandwidth limit on the link to Redis, and Redis restarted (killed,
started again empty on the same port). A ``juggler server`` and a ``juggler
callee`` process reach Redis through toxiproxy; websocket clients call in a
loop. The promises are those of every juggler fault test
(``tests/faults/jugglertraffic.py``): every CALL answered within its timeout
plus a bound, one RES per ACKed call (what a restart lost gets the timeout
error RES), calls back within a bound once the fault ends, both processes
alive and exiting 0, the server's descriptors back to their level.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

import pytest

from juggler.client import connect
from tests.faults.conftest import fd_count
from tests.faults.jugglertraffic import RECOVERY, Traffic
from tests.faults.toxiproxy import Link, Toxiproxy
from tests.juggler.jugglerprocs import Proc, juggler
from tests.netutil import RedisServer, free_port, start_redis, wait_for_port, wait_until

pytestmark = [pytest.mark.timeout(120)]

ECHO = ("test.echo", "x", "x")
#: how long a fault lasts (s)
FAULT = 4.0


@pytest.fixture
def redis_behind(toxiproxy: Toxiproxy) -> Iterator[tuple[RedisServer, Link]]:
    redis = start_redis()
    try:
        yield redis, toxiproxy.link(f"juggler-redis-{redis.port}", f"127.0.0.1:{redis.port}")
    finally:
        redis.stop()


@contextlib.asynccontextmanager
async def stack(link: Link) -> AsyncIterator[tuple[Traffic, str]]:
    """Callee and server processes on Redis through ``link``, callers calling
    ECHO; yields the traffic and the server's URL, then checks every call."""
    url = f"redis://{link.address}/0"
    callee = Proc(juggler("callee", "--redis", url, "--workers", "20"))
    port = free_port()
    server = Proc(juggler("server", "--redis", url, "--listen", f"127.0.0.1:{port}",
                          "--set", "redis.command_timeout=2.0"))
    ws = f"ws://127.0.0.1:{port}/ws"
    try:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, lambda: wait_for_port(port, timeout=30, proc=server.proc))
        t = Traffic()
        async with connect(ws, on_message=t.on_message) as calling, connect(ws) as spare:
            await t.back(spare, *ECHO, bound=30)
            level = fd_count(server.proc.pid)
            t.start(calling, *ECHO)
            yield t, ws
            await t.back(spare, *ECHO, bound=RECOVERY)
            await t.stop()
            await wait_until(lambda: fd_count(server.proc.pid) <= level, 10,
                             what=lambda: f"the server's descriptors back to {level} (now {fd_count(server.proc.pid)})")
        assert server.proc.poll() is None, server.output()
        assert callee.proc.poll() is None, callee.output()
    finally:
        logs = server.output(), callee.output()
        codes = server.stop(), callee.stop()
    assert codes == (0, 0), f"exit codes {codes}\nserver:\n{logs[0][-3000:]}\ncallee:\n{logs[1][-3000:]}"


async def test_a_bandwidth_limit_to_redis_slows_calls_and_loses_none(redis_behind: tuple[RedisServer, Link]) -> None:
    _, link = redis_behind
    async with stack(link) as (t, _):
        await asyncio.sleep(0.5)  # traffic before the fault: a window of time is the point
        since = t.loop.time()
        link.toxic("bandwidth", "upstream", name="up", rate=4)  # KB/s, server and callee alike
        link.toxic("bandwidth", "downstream", name="down", rate=4)
        await asyncio.sleep(FAULT)
        until = t.loop.time()
        link.clear()
    during = [c for c in t.of(ECHO[0], since + 1.0, until - 1.0) if c.ok]
    assert during, "no call through the throttled link"
    # the limit had its effect: every call waited for its bytes (a call takes a few ms without it)
    assert min(c.res[0][0] - c.sent for c in during) >= 0.05


async def test_redis_restarted_empty_calls_come_back_and_none_hangs(redis_behind: tuple[RedisServer, Link]) -> None:
    redis, link = redis_behind
    async with stack(link) as (t, _):
        await asyncio.sleep(0.5)
        since = t.loop.time()
        redis.proc.kill()  # SIGKILL: no persistence, so what was queued is gone

        def restart() -> RedisServer:  # blocking waits, off the event loop the callers run on
            redis.proc.wait(timeout=10)
            return start_redis(port=redis.port)

        restarted = await asyncio.get_running_loop().run_in_executor(None, restart)
        redis.proc, redis.dir = restarted.proc, restarted.dir
        await asyncio.sleep(1.0)
    after = [c for c in t.of(ECHO[0], since + 0.5) if c.ok]
    assert after, "no call succeeded after the restart"
