"""Connection behaviour over every channel kind (inproc, tcp, unix)."""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any

import pytest

from rpc.transport import (
    ConnectionConfig,
    ConnectionLost,
    InProcNetwork,
    PoolConfig,
    QueueFull,
    RemoteError,
    RequestTimeout,
    ServerConfig,
    TransportClosed,
    TransportPool,
    TransportServer,
)
from tests.netutil import wait_until

pytestmark = pytest.mark.timeout(60)


def echo(conn: Any, msg: Any) -> bytes:
    return msg.payload


async def test_request_response(endpoint: str, inproc: InProcNetwork, no_leaks: None) -> None:
    async with TransportServer(endpoint, echo, inproc=inproc) as srv, TransportPool(inproc=inproc) as pool:
        conn = await pool.get(srv.endpoint)
        resp = await conn.request(b"hello", service_path="Svc", service_method="Echo", metadata=[("k", "v")])
        assert resp.payload == b"hello"
        assert (resp.service_path, resp.service_method) == ("Svc", "Echo")
        big = bytes(random.Random(1).randbytes(3 * 1024 * 1024))
        assert (await conn.request(big)).payload == big
        hb = await conn.heartbeat(b"ping")
        assert hb.heartbeat and hb.payload == b"ping"


async def test_interleaved_concurrent_requests_and_reordering(endpoint: str, inproc: InProcNetwork, no_leaks: None) -> None:
    """Many concurrent requests, answered out of order (later ones first): each
    caller gets its own response."""

    async def slow_first(conn: Any, msg: Any) -> bytes:
        n = int(msg.payload)
        await asyncio.sleep((50 - n) * 0.001)
        return b"re:" + msg.payload

    async with TransportServer(endpoint, slow_first, inproc=inproc) as srv, TransportPool(inproc=inproc) as pool:
        conn = await pool.get(srv.endpoint)
        order: list[int] = []

        async def one(i: int) -> None:
            r = await conn.request(str(i).encode())
            assert r.payload == b"re:" + str(i).encode()
            order.append(i)

        await asyncio.gather(*(one(i) for i in range(50)))
        assert sorted(order) == list(range(50))
        assert order != list(range(50)), "responses were expected out of order"
        assert conn.in_flight == 0


async def test_full_duplex_server_push(endpoint: str, inproc: InProcNetwork, no_leaks: None) -> None:
    """The server sends requests to the client on the same connection, while
    the client's own requests are in flight."""
    pushed = asyncio.get_running_loop().create_future()
    server_conns: list[Any] = []

    async def client_handler(conn: Any, msg: Any) -> bytes:
        return b"client says " + msg.payload

    async def server_handler(conn: Any, msg: Any) -> bytes:
        # while handling the client's request, call the client back
        reply = await conn.request(b"hi from server")
        return reply.payload

    def on_note(conn: Any, msg: Any) -> None:
        if not pushed.done():
            pushed.set_result(msg.payload)

    async with TransportServer(endpoint, server_handler, inproc=inproc, on_connection=server_conns.append) as srv:
        async with TransportPool(inproc=inproc, handler=lambda c, m: on_note(c, m) if m.oneway else client_handler(c, m)) as pool:
            conn = await pool.get(srv.endpoint)
            resp = await conn.request(b"x")
            assert resp.payload == b"client says hi from server"
            await server_conns[0].notify(b"push!")  # fire-and-forget server push
            assert await asyncio.wait_for(pushed, 10) == b"push!"


async def test_request_styles(endpoint: str, inproc: InProcNetwork, no_leaks: None) -> None:
    got: asyncio.Queue[Any] = asyncio.Queue()

    def handler(conn: Any, msg: Any) -> bytes | None:
        if msg.oneway:
            got.put_nowait(msg.payload)
            return None
        return msg.payload.upper()

    async with TransportServer(endpoint, handler, inproc=inproc) as srv, TransportPool(inproc=inproc) as pool:
        conn = await pool.get(srv.endpoint)
        # future style
        fut = conn.submit(b"abc")
        assert fut is not None
        assert (await fut).payload == b"ABC"
        # callback style
        done = asyncio.get_running_loop().create_future()
        assert conn.submit(b"cb", callback=lambda m, e: done.set_result((m.payload, e))) is None
        assert await done == (b"CB", None)
        # fire-and-forget
        await conn.notify(b"oneway")
        assert await asyncio.wait_for(got.get(), 10) == b"oneway"
        assert conn.in_flight == 0


async def test_payload_codecs(inproc: InProcNetwork, no_leaks: None) -> None:
    def handler(conn: Any, msg: Any) -> Any:
        obj = conn.protocol.payload.decode(msg.payload)
        return {"sum": obj["a"] + obj["b"], "via": conn.protocol.name}

    for proto in ("rpcx+json", "rpcx+msgpack", "frame+json", "frame+msgpack"):
        ep = f"inproc://{proto}"
        async with TransportServer(ep, handler, protocol=proto, inproc=inproc) as srv, TransportPool(proto, inproc=inproc) as pool:
            conn = await pool.get(srv.endpoint)
            assert await conn.call({"a": 1, "b": 2}) == {"sum": 3, "via": proto}


async def test_remote_error_and_deadline(endpoint: str, inproc: InProcNetwork, no_leaks: None) -> None:
    async def handler(conn: Any, msg: Any) -> bytes:
        if msg.payload == b"boom":
            raise RuntimeError("kaput")
        if msg.payload == b"slow":
            await asyncio.sleep(30)
        return b"ok"

    cfg = ServerConfig(connection=ConnectionConfig(drain_timeout=0.1))
    async with TransportServer(endpoint, handler, inproc=inproc, config=cfg) as srv, TransportPool(inproc=inproc) as pool:
        conn = await pool.get(srv.endpoint)
        with pytest.raises(RemoteError, match="kaput"):
            await conn.request(b"boom")
        with pytest.raises(RequestTimeout):
            await conn.request(b"slow", timeout=0.02)
        assert conn.in_flight == 0
        # the connection is still fine after a timeout
        assert (await conn.request(b"x")).payload == b"ok"


async def test_many_deadlines_fire_in_order(inproc: InProcNetwork, no_leaks: None) -> None:
    async def never(conn: Any, msg: Any) -> None:
        await asyncio.sleep(30)

    cfg = ServerConfig(connection=ConnectionConfig(drain_timeout=0.05))
    async with TransportServer("inproc://d", never, inproc=inproc, config=cfg) as srv, TransportPool(inproc=inproc) as pool:
        conn = await pool.get(srv.endpoint)
        failed: list[int] = []

        async def one(i: int) -> None:
            with pytest.raises(RequestTimeout):
                await conn.request(b"", timeout=0.005 * (i + 1))
            failed.append(i)

        await asyncio.gather(*(one(i) for i in reversed(range(10))))
        assert failed == list(range(10))


async def test_cancelled_caller_only_drops_its_entry(endpoint: str, inproc: InProcNetwork, no_leaks: None) -> None:
    release = asyncio.Event()

    async def handler(conn: Any, msg: Any) -> bytes:
        if msg.payload == b"wait":
            await release.wait()
        return msg.payload

    async with TransportServer(endpoint, handler, inproc=inproc) as srv, TransportPool(inproc=inproc) as pool:
        conn = await pool.get(srv.endpoint)
        task = asyncio.ensure_future(conn.request(b"wait"))
        await wait_until(lambda: conn.in_flight == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert conn.in_flight == 0
        release.set()  # the late response arrives and is dropped
        assert (await conn.request(b"next")).payload == b"next"


async def test_bad_input_closes_only_that_connection(endpoint: str, inproc: InProcNetwork, caplog: pytest.LogCaptureFixture, no_leaks: None) -> None:
    caplog.set_level(logging.WARNING, "rpc.transport.connection")
    async with TransportServer(endpoint, echo, inproc=inproc) as srv:
        async with TransportPool(inproc=inproc) as good, TransportPool(inproc=inproc) as bad:
            ok = await good.get(srv.endpoint)
            victim = await bad.get(srv.endpoint)
            assert len(srv.connections) == 2
            assert victim.transport is not None
            victim.transport.write(b"GET / HTTP/1.1\r\n\r\n")  # garbage on an rpcx stream
            await asyncio.wait_for(victim.wait_closed(), 10)
            assert "bad input" in caplog.text
            assert (await ok.request(b"still here")).payload == b"still here"


async def test_oversized_frame_closes_connection(endpoint: str, inproc: InProcNetwork, no_leaks: None) -> None:
    small = ServerConfig(connection=ConnectionConfig(max_frame=1024))
    async with TransportServer(endpoint, echo, inproc=inproc, config=small) as srv, TransportPool(inproc=inproc) as pool:
        conn = await pool.get(srv.endpoint)
        assert (await conn.request(b"x" * 100)).payload == b"x" * 100
        with pytest.raises(ConnectionLost):
            await conn.request(b"x" * 5000)


async def test_back_pressure_fail_fast_and_wait(inproc: InProcNetwork, no_leaks: None) -> None:
    """A peer that stops reading fills the bounded send queue: fail-fast raises
    QueueFull, the wait policy blocks until the peer reads again."""
    gate = asyncio.Event()
    server_conns: list[Any] = []

    async def handler(conn: Any, msg: Any) -> bytes:
        await gate.wait()
        return b"k"

    scfg = ServerConfig(connection=ConnectionConfig(max_handlers=1, drain_timeout=1))
    async with TransportServer("inproc://bp", handler, inproc=inproc, config=scfg, on_connection=server_conns.append) as srv:
        for policy in ("fail", "wait"):
            pcfg = PoolConfig(connection=ConnectionConfig(send_queue_bytes=64 * 1024, send_policy=policy))
            async with TransportPool(inproc=inproc, config=pcfg) as pool:
                conn = await pool.get(srv.endpoint)
                futs = []
                blocked = None
                for _ in range(200):  # 200 x 16 KiB > the 1 MiB in-memory pipe + 64 KiB queue
                    try:
                        if policy == "fail":
                            futs.append(conn.submit(b"x" * 16384))
                        else:
                            t = asyncio.ensure_future(conn.request(b"x" * 16384))
                            futs.append(t)
                            await asyncio.sleep(0)  # two loop turns: the request
                            await asyncio.sleep(0)  # task queues, the flush writes
                            if conn.send_queue_size >= 64 * 1024 and conn._write_paused:
                                blocked = asyncio.ensure_future(conn.request(b"last"))
                                await asyncio.sleep(0.01)  # an absence: it stays blocked a while
                                assert not blocked.done()
                                break
                    except QueueFull:
                        blocked = True
                        break
                    await asyncio.sleep(0)
                assert blocked is not None, "the send queue never filled"
                gate.set()  # the server drains: everything completes
                results = await asyncio.wait_for(asyncio.gather(*futs), 20)
                assert all(r.payload == b"k" for r in results)
                if policy == "wait":
                    assert (await asyncio.wait_for(blocked, 20)).payload == b"k"  # type: ignore[arg-type]
                gate.clear()


async def test_handler_limits_per_connection_and_server(inproc: InProcNetwork, no_leaks: None) -> None:
    running = 0
    peak = 0
    gate = asyncio.Event()

    async def handler(conn: Any, msg: Any) -> bytes:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await gate.wait()
        running -= 1
        return b"done"

    cfg = ServerConfig(max_handlers=5, connection=ConnectionConfig(max_handlers=3))
    async with TransportServer("inproc://lim", handler, inproc=inproc, config=cfg) as srv:
        async with TransportPool(inproc=inproc) as p1, TransportPool(inproc=inproc) as p2:
            c1, c2 = await p1.get(srv.endpoint), await p2.get(srv.endpoint)
            tasks = [asyncio.ensure_future(c.request(b"")) for c in (c1, c2) for _ in range(10)]
            await wait_until(lambda: running >= 5, what="the server-wide limit of handlers running")
            assert peak == 5  # server-wide bound
            assert all(c.handlers_running <= 3 for c in srv.connections)
            gate.set()
            assert [r.payload for r in await asyncio.gather(*tasks)] == [b"done"] * 20
            assert peak == 5


async def test_graceful_close_drains_in_flight(endpoint: str, inproc: InProcNetwork, no_leaks: None) -> None:
    started = asyncio.Event()

    async def handler(conn: Any, msg: Any) -> bytes:
        started.set()
        await asyncio.sleep(0.05)
        return b"finished"

    srv = TransportServer(endpoint, handler, inproc=inproc)
    await srv.start()
    async with TransportPool(inproc=inproc) as pool:
        conn = await pool.get(srv.endpoint)
        inflight = asyncio.ensure_future(conn.request(b""))
        await started.wait()
        await srv.aclose(timeout=5)
        assert (await inflight).payload == b"finished"
        await srv.aclose()  # idempotent
        with pytest.raises(ConnectionLost):
            await conn.request(b"after close")


async def test_drain_deadline_fails_leftovers(inproc: InProcNetwork, no_leaks: None) -> None:
    async def handler(conn: Any, msg: Any) -> None:
        await asyncio.sleep(30)

    async with TransportServer("inproc://dd", handler, inproc=inproc) as srv:
        pool = TransportPool(inproc=inproc)
        conn = await pool.get(srv.endpoint)
        inflight = asyncio.ensure_future(conn.request(b"", timeout=None))
        await wait_until(lambda: conn.in_flight == 1)
        await conn.aclose(timeout=0.02)
        with pytest.raises(TransportClosed):
            await inflight
        await conn.aclose()  # idempotent
        conn.close()
        with pytest.raises(TransportClosed):
            await conn.request(b"")
        await pool.aclose()
        await pool.aclose()


async def test_ids_never_collide_after_wrap(inproc: InProcNetwork, no_leaks: None) -> None:
    gate = asyncio.Event()

    async def handler(conn: Any, msg: Any) -> bytes:
        if msg.payload == b"hold":
            await gate.wait()
        return msg.payload

    async with TransportServer("inproc://w", handler, inproc=inproc) as srv, TransportPool(inproc=inproc) as pool:
        conn = await pool.get(srv.endpoint)
        held = asyncio.ensure_future(conn.request(b"hold"))  # seq 1 stays in flight
        await wait_until(lambda: conn.in_flight == 1)
        conn._next_seq = (1 << 64) - 1  # force the counter to wrap onto 1
        a = await conn.request(b"a")  # seq 2^64-1
        b = await conn.request(b"b")  # would be 1: skipped, gets 2
        assert a.seq == (1 << 64) - 1 and b.seq == 2
        gate.set()
        assert (await held).payload == b"hold"


async def test_drain_refuses_new_requests_under_load(endpoint: str, inproc: InProcNetwork, no_leaks: None) -> None:
    """While the server drains, requests already running finish and new ones
    are refused at once, so the drain ends although the client keeps sending."""
    started = asyncio.Event()

    async def handler(conn: Any, msg: Any) -> bytes:
        if msg.payload == b"long":
            started.set()
            await asyncio.sleep(0.1)
        return msg.payload

    srv = TransportServer(endpoint, handler, inproc=inproc)
    await srv.start()
    async with TransportPool(inproc=inproc) as pool:
        conn = await pool.get(srv.endpoint)
        long = asyncio.ensure_future(conn.request(b"long"))
        await started.wait()
        closing = asyncio.ensure_future(srv.aclose(timeout=10))
        refused = 0
        while not closing.done():
            try:
                await conn.request(b"more", timeout=5)
            except RemoteError as exc:
                assert "closing" in str(exc)
                refused += 1
            except ConnectionLost:
                break
        await asyncio.wait_for(closing, 10)
        assert (await long).payload == b"long"
        assert refused > 0


async def test_max_connections_refuses_extra(inproc: InProcNetwork, caplog: pytest.LogCaptureFixture, no_leaks: None) -> None:
    caplog.set_level(logging.WARNING, "rpc.transport.server")
    async with TransportServer("inproc://mc", echo, inproc=inproc, config=ServerConfig(max_connections=1)) as srv:
        async with TransportPool(inproc=inproc) as p1, TransportPool(inproc=inproc) as p2:
            first = await p1.get(srv.endpoint)
            second = await p2.get(srv.endpoint)
            await asyncio.wait_for(second.wait_closed(), 10)
            assert "max_connections" in caplog.text
            assert (await first.request(b"ok")).payload == b"ok"
            assert len(srv.connections) == 1


async def test_unix_listener_replaces_stale_socket_file(tmp_path: Any, no_leaks: None) -> None:
    import socket as pysocket

    path = str(tmp_path / "stale.sock")
    stale = pysocket.socket(pysocket.AF_UNIX)
    stale.bind(path)  # a socket file left behind by a dead process
    stale.close()
    async with TransportServer(f"unix://{path}", echo) as srv, TransportPool() as pool:
        assert (await pool.request(srv.endpoint, b"u")).payload == b"u"
    import os

    assert not os.path.exists(path), "the listener removes its socket file on close"


async def test_unencodable_result_is_an_error_reply(inproc: InProcNetwork, no_leaks: None) -> None:
    async def async_bad(conn: Any, msg: Any) -> Any:
        return "a str is not raw bytes"

    for handler in (lambda conn, msg: object(), async_bad):
        async with TransportServer("inproc://enc", handler, inproc=inproc) as srv, TransportPool(inproc=inproc) as pool:
            conn = await pool.get(srv.endpoint)
            with pytest.raises(RemoteError, match="cannot encode"):
                await conn.request(b"")
            assert conn.is_open


async def test_garbage_from_server_fails_client_requests_with_connection_lost(inproc: InProcNetwork, no_leaks: None) -> None:
    from rpc.transport import ProtocolError

    server_conns: list[Any] = []

    async def never(conn: Any, msg: Any) -> None:
        await asyncio.sleep(30)

    cfg = ServerConfig(connection=ConnectionConfig(drain_timeout=0.01))
    async with TransportServer("inproc://g", never, inproc=inproc, on_connection=server_conns.append, config=cfg) as srv:
        async with TransportPool(inproc=inproc) as pool:
            conn = await pool.get(srv.endpoint)
            inflight = asyncio.ensure_future(conn.request(b"", timeout=30))
            await wait_until(lambda: conn.in_flight == 1)
            server_conns[0].transport.write(b"\x09garbage")
            with pytest.raises(ConnectionLost) as info:
                await asyncio.wait_for(inflight, 10)
            assert isinstance(info.value.__cause__, ProtocolError)


async def test_long_backlog_of_sync_handlers_does_not_recurse(inproc: InProcNetwork, no_leaks: None) -> None:
    """Thousands of queued requests behind a full server-wide limit, then
    drained by sync handlers: no recursion per queued request."""
    gate = asyncio.Event()
    blocking = asyncio.Event()

    def handler(conn: Any, msg: Any) -> Any:
        if msg.payload == b"block":
            async def wait() -> bytes:
                blocking.set()
                await gate.wait()
                return b"unblocked"
            return wait()
        return msg.payload

    cfg = ServerConfig(max_handlers=1, connection=ConnectionConfig(max_handlers=1))
    async with TransportServer("inproc://deep", handler, inproc=inproc, config=cfg) as srv, TransportPool(inproc=inproc) as pool:
        conn = await pool.get(srv.endpoint)
        blocker = asyncio.ensure_future(conn.request(b"block"))
        await asyncio.wait_for(blocking.wait(), 10)
        many = [conn.submit(b"%d" % i) for i in range(3000)]
        (server_side,) = srv.connections
        await wait_until(lambda: len(server_side._backlog) == 3000, what="3000 requests queued on the server")
        gate.set()
        assert (await blocker).payload == b"unblocked"
        results = await asyncio.wait_for(asyncio.gather(*many), 30)  # type: ignore[arg-type]
        assert [r.payload for r in results] == [b"%d" % i for i in range(3000)]


async def test_stop_accepting_keeps_serving_accepted_connections(no_leaks: None) -> None:
    from rpc.transport import Connection, Unavailable

    made: list[Connection] = []

    class Counting(Connection):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    async with TransportServer("tcp://127.0.0.1:0", echo, connection_factory=Counting) as srv:
        async with TransportPool(config=PoolConfig(connect_timeout=2, down_after=1)) as p1, \
                TransportPool(config=PoolConfig(connect_timeout=2, down_after=1)) as p2:
            first = await p1.get(srv.endpoint)
            assert len(made) == 1 and made[0] in srv.connections
            srv.stop_accepting()
            srv.stop_accepting()  # idempotent
            assert (await first.request(b"still")).payload == b"still"
            with pytest.raises(Unavailable):
                await p2.get(srv.endpoint)
