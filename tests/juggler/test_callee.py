"""The callee runtime: function kinds, errors, TTL handling, concurrency,
drain — over the real Redis broker — and `juggler callee` as a process,
driven the way the original Go server drives Redis."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator

import pytest

from rustext.appspec import AppImportError
import redis.asyncio as aredis

from juggler.broker.base import Result
from juggler.broker.redis import PUSH_SCRIPT, RedisBroker, RedisBrokerConfig, call_key, call_ttl_key, result_key
from juggler.callee import Callee, CalleeApp, error_result, load_app, make_test_app
from tests.netutil import wait_until

pytestmark = pytest.mark.timeout(60)

CONN = "46d0ff32-efe4-409c-a7eb-2e94fde9ae32"


def uid(i: int) -> str:
    return f"00000000-0000-4000-8000-{i:012d}"


class Harness:
    """A caller broker collecting results, and a callee broker."""

    def __init__(self, url: str) -> None:
        self.caller = RedisBroker(RedisBrokerConfig(url=url, block_timeout=0.3, conn_uuid=CONN))
        self.callee_broker = RedisBroker(RedisBrokerConfig(url=url, block_timeout=0.3))
        self.results: dict[str, Result] = {}
        self._changed = asyncio.Event()

    async def start(self) -> None:
        self.caller.on_result(self._on)
        await self.caller.start()
        await self.callee_broker.start()

    def _on(self, res: Result) -> None:
        self.results[res.msg_uuid] = res
        self._changed.set()

    async def result(self, msg_uuid: str, timeout: float = 5.0) -> bytes | None:
        async with asyncio.timeout(timeout):
            while msg_uuid not in self.results:
                self._changed.clear()
                await self._changed.wait()
        return self.results[msg_uuid].args

    async def aclose(self) -> None:
        await self.callee_broker.aclose()
        await self.caller.aclose()


@pytest.fixture
async def h(redis_url: str) -> AsyncIterator[Harness]:
    harness = Harness(redis_url)
    await harness.start()
    yield harness
    await harness.aclose()


async def test_test_callees(h: Harness) -> None:
    async with Callee(h.callee_broker, make_test_app(2), workers=4) as callee:
        cases = {
            uid(1): ("test.echo", b'"hello"', b'"hello"'),
            uid(2): ("test.reverse", '"héllo wörld ✓ 日本語 🎉"'.encode(), '"🎉 語本日 ✓ dlröw olléh"'.encode()),
            uid(3): ("test.delay", b'"20"', b"20"),
            uid(4): ("test.delay.1", b'"0"', b"0"),
        }
        for u, (uri, args, _) in cases.items():
            await h.caller.call(u, uri, args, 5000)
        for u, (_, _, want) in cases.items():
            assert await h.result(u) == want
        # errors come back as results
        for i, (uri, args) in enumerate([("test.delay", b'"abc"'), ("test.echo", b'{"a":1}'),
                                          ("test.echo", None), ("test.reverse", b"5")]):
            await h.caller.call(uid(10 + i), uri, args, 5000)
            err = json.loads(await h.result(uid(10 + i)) or b"null")
            assert set(err) == {"error"} and err["error"]["message"]
        assert callee.stats.errors == 4
        assert callee.stats.results == 8


async def test_function_kinds_and_errors(h: Harness) -> None:
    app = CalleeApp()

    @app.register("k.async")
    async def add(args: dict) -> int:
        return args["a"] + args["b"]

    app.register("k.sync", lambda args: {"thread": True, "got": args})  # runs in the thread pool
    app.register("k.raw", lambda raw: b"[" + (raw or b"null") + b"]", raw=True, inline=True)

    def fail(args: object) -> None:
        raise RuntimeError("it broke")

    app.register("k.fail", fail)
    app.register("k.badraw", lambda raw: 42, raw=True, inline=True)
    app.register("k.notjson", lambda raw: b"{nope", raw=True, inline=True)
    app.register("k.notjson.async", _notjson, raw=True)
    app.register("k.nan", lambda args: float("nan"))
    async with Callee(h.callee_broker, app, workers=2):
        await h.caller.call(uid(1), "k.async", b'{"a":1,"b":2}', 5000)
        await h.caller.call(uid(2), "k.sync", b"[1,2]", 5000)
        await h.caller.call(uid(3), "k.raw", None, 5000)
        await h.caller.call(uid(4), "k.fail", b"1", 5000)
        await h.caller.call(uid(5), "k.badraw", b"1", 5000)
        assert await h.result(uid(1)) == b"3"
        assert json.loads(await h.result(uid(2)) or b"") == {"thread": True, "got": [1, 2]}
        assert await h.result(uid(3)) == b"[null]"
        assert await h.result(uid(4)) == error_result("it broke") == b'{"error":{"message":"it broke"}}'
        assert b"raw function must return" in (await h.result(uid(5)) or b"")
        for i, uri in ((6, "k.notjson"), (7, "k.notjson.async"), (8, "k.nan")):
            await h.caller.call(uid(i), uri, b"1", 5000)
            err = json.loads(await h.result(uid(i)) or b"null")
            assert set(err) == {"error"}, (uri, err)


async def _notjson(raw: bytes | None) -> bytes:
    return b"not json"


async def test_unknown_uri_is_an_error_result(h: Harness) -> None:
    app = CalleeApp()
    app.register("a", lambda x: x)
    async with Callee(h.callee_broker, app, uris=["a", "b"], workers=1):
        await h.caller.call(uid(1), "b", b"1", 5000)
        assert b"no function registered" in (await h.result(uid(1)) or b"")


async def test_ttl_expired_during_execution_stores_nothing(h: Harness, redis_url: str) -> None:
    r = aredis.Redis.from_url(redis_url)
    try:
        async with Callee(h.callee_broker, make_test_app(), workers=2) as callee:
            await h.caller.call(uid(1), "test.delay", b'"300"', 100)  # 100 ms to live, runs 300 ms
            await h.caller.call(uid(2), "test.echo", b'"after"', 5000)
            assert await h.result(uid(2)) == b'"after"'
            await wait_until(lambda: callee.stats.expired >= 1, what="the expired call counted")
        assert uid(1) not in h.results
        assert await r.exists(result_key(CONN)) == 0
    finally:
        await r.aclose()


async def test_result_ttl_is_the_remaining_time(redis_url: str) -> None:
    r = aredis.Redis.from_url(redis_url)
    broker = RedisBroker(RedisBrokerConfig(url=redis_url, block_timeout=0.3))
    await broker.start()
    try:
        # as the Go server pushes a call
        payload = '{"conn_uuid":"%s","msg_uuid":"%s","uri":"test.delay","args":"100"}' % (CONN, uid(1))
        await r.eval(PUSH_SCRIPT.body.decode(), 2, call_ttl_key("test.delay", uid(1)), call_key("test.delay"), 2000, payload, 0)
        async with Callee(broker, make_test_app(), workers=1):
            await wait_until(lambda: r.exists(result_key(CONN)), what="the result stored")
        stored = int(await r.get(f"juggler:results:timeout:{{{CONN}}}:{uid(1)}"))
        assert 0 < stored <= 1900  # 2000 minus the 100 ms it ran
        (res,) = await r.lrange(result_key(CONN), 0, -1)
        assert json.loads(res) == {"conn_uuid": CONN, "msg_uuid": uid(1), "uri": "test.delay", "args": 100}
    finally:
        await broker.aclose()
        await r.aclose()


async def test_workers_bound_concurrency_and_drain_finishes_running_calls(h: Harness) -> None:
    running = 0
    peak = 0
    release = asyncio.Event()
    started = asyncio.Event()

    async def slow(args: object) -> str:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        if running == 3:
            started.set()
        await release.wait()
        running -= 1
        return "done"

    app = CalleeApp()
    app.register("slow", slow)
    callee = Callee(h.callee_broker, app, workers=3)
    await callee.start()
    for i in range(6):
        await h.caller.call(uid(i), "slow", b"null", 10_000)
    async with asyncio.timeout(5):
        await started.wait()
    assert callee.stats.running == 3
    drain = asyncio.create_task(callee.drain(timeout=10))
    await wait_until(lambda: callee._pump is not None and callee._pump.done(), what="the drain stopped taking calls")
    release.set()
    await drain
    await callee.aclose()
    assert peak == 3
    assert callee.stats.results == 3  # the 3 running ones finished and were stored
    await wait_until(lambda: len(h.results) == 3, what="their results at the caller")
    assert [r.args for r in h.results.values()] == [b'"done"'] * 3
    # the 3 not started are still queued for another callee (nothing was lost)
    r = aredis.Redis.from_url(h.caller.config.url)
    try:
        assert await r.llen(call_key("slow")) == 3
    finally:
        await r.aclose()


async def test_load_app(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "myapp_mod.py").write_text(
        "from juggler.callee import CalleeApp\n"
        "app = CalleeApp()\n"
        "app.register('x.one', lambda a: 1)\n"
        "funcs = {'y.two': lambda a: 2}\n"
        "def make():\n    return {'z.three': lambda a: 3}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_app("myapp_mod:app").uris == ["x.one"]
    assert load_app("myapp_mod:funcs").uris == ["y.two"]
    assert load_app("myapp_mod:make").uris == ["z.three"]
    with pytest.raises(AppImportError, match="MODULE:OBJECT"):
        load_app("nocolon")
    with pytest.raises(AppImportError, match="no module named 'nope'"):
        load_app("nope:app")
    with pytest.raises(AppImportError, match="no attribute 'missing'"):
        load_app("myapp_mod:missing")


def test_callee_needs_workers_and_uris() -> None:
    class Dummy:
        def calls(self, uris):  # type: ignore[no-untyped-def]
            raise AssertionError

        async def send_result(self, result, ttl_ms):  # type: ignore[no-untyped-def]
            raise AssertionError

    with pytest.raises(ValueError):
        Callee(Dummy(), make_test_app(), workers=0)
    with pytest.raises(ValueError):
        Callee(Dummy(), CalleeApp())


async def test_cli_callee_serves_calls_pushed_like_the_go_server(redis_url: str) -> None:
    """`juggler callee` as a real process; calls pushed exactly as upstream's server does."""
    from tests.netutil import free_port

    env = dict(os.environ)
    mport = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", "callee", "--redis", redis_url, "--workers", "8", "-n", "2",
         "--metrics-port", str(mport)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
    )
    r = aredis.Redis.from_url(redis_url)
    try:
        async def blocked() -> bool:  # the callee blocks on its calls lists
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            return int((await r.info("clients"))["blocked_clients"]) >= 1

        await wait_until(blocked, timeout=30, interval=0.05, what="the callee process waiting for calls")
        calls = [(uid(1), "test.echo", '"hello"'), (uid(2), "test.reverse", '"abc"'), (uid(3), "test.delay.1", '"5"')]
        for u, uri, args in calls:
            payload = '{"conn_uuid":"%s","msg_uuid":"%s","uri":"%s","args":%s}' % (CONN, u, uri, args)
            await r.evalsha(PUSH_SCRIPT.sha.decode(), 2, call_ttl_key(uri, u), call_key(uri), 5000, payload, 0)
        got = {}
        async with asyncio.timeout(15):
            while len(got) < 3:
                item = await r.brpop([result_key(CONN)], timeout=1)
                if item:
                    p = json.loads(item[1])
                    got[p["msg_uuid"]] = p["args"]
        assert got == {uid(1): "hello", uid(2): "cba", uid(3): 5}
        import urllib.request

        def scrape() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=10) as resp:
                return resp.read().decode()

        # the result is in Redis a moment before the callee counts it: poll (bounded)
        async def counted() -> str | None:
            body = await asyncio.to_thread(scrape)
            return body if "juggler_callee_results_total 3.0" in body else None

        body = await wait_until(counted, interval=0.05, what="the callee counting 3 results")
        assert "juggler_callee_calls_total 3.0" in body
        assert "juggler_callee_running 0.0" in body
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)
        if proc.stdout is not None:
            proc.stdout.close()
        await r.aclose()
