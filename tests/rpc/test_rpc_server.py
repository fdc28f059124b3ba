"""Server: registration, publication to a real Redis registry, graceful
shutdown order (unregister, stop accepting, drain, close) losing no call."""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aioredis

from rpc.discovery.libkv import decode_pair
from rpc.discovery.redis import RedisRegistrar
from rpc.examples import Arith
from rpc.message import META_ERROR, Message
from rpc.server import Server
from rpc.service import Context
from tests.netutil import wait_until

ADDR = "tcp@127.0.0.1:8972"


class Slow:
    def __init__(self) -> None:
        self.started = 0
        self.first_started = asyncio.Event()
        self.all_started = asyncio.Event()
        self.release = asyncio.Event()
        self.finished = 0

    async def Work(self, ctx: Context, args: int) -> int:
        self.started += 1
        self.first_started.set()
        if self.started == 3:
            self.all_started.set()
        await self.release.wait()
        self.finished += 1
        return args * 2


class RecordingListener:
    """The transport seam: records when shutdown reaches each step."""

    def __init__(self, steps: list[str], redis: aioredis.Redis, server: Server) -> None:
        self.steps = steps
        self.redis = redis
        self.server = server
        self.stopped = asyncio.Event()

    async def stop_accepting(self) -> None:
        registered = await self.redis.exists(f"//rpcx/Slow/{ADDR}")
        self.steps.append(f"stop_accepting(registered={registered}, in_flight={self.server.in_flight})")
        self.stopped.set()

    async def close_connections(self) -> None:
        self.steps.append(f"close_connections(in_flight={self.server.in_flight})")


async def test_graceful_shutdown_order_loses_no_accepted_call(redis_url: str) -> None:
    redis = aioredis.Redis.from_url(redis_url)
    server = Server(registrars=[RedisRegistrar(redis_url, ttl=10)])
    slow = Slow()
    server.register(slow, metadata="weight=1")
    server.register(Arith)
    await server.publish(ADDR)
    assert decode_pair(await redis.get(f"//rpcx/Slow/{ADDR}")).value == b"weight=1"  # Go rpcx's layout
    assert await redis.exists(f"//rpcx/Arith/{ADDR}") == 1

    calls = [
        asyncio.create_task(server.dispatcher.dispatch(Message(service_path="Slow", service_method="Work", seq=i, payload=b"%d" % i)))
        for i in range(3)
    ]
    await slow.all_started.wait()
    steps: list[str] = []
    listener = RecordingListener(steps, redis, server)
    shutdown = asyncio.create_task(server.shutdown(listener, timeout=10))
    await listener.stopped.wait()
    await wait_until(lambda: server.dispatcher.closing, what="shutdown refusing new calls")  # and draining
    late = await server.dispatcher.dispatch(Message(service_path="Arith", service_method="Add", payload=b'{"A":1,"B":1}'))
    assert late.reply is not None and late.reply.metadata[META_ERROR] == "server is shutting down"
    slow.release.set()
    assert await shutdown is True
    replies = [(await c).reply for c in calls]
    assert [r.payload for r in replies] == [b"0", b"2", b"4"] and slow.finished == 3
    assert steps == ["stop_accepting(registered=0, in_flight=3)", "close_connections(in_flight=0)"]
    assert await redis.exists(f"//rpcx/Arith/{ADDR}") == 0
    assert await server.shutdown() is True  # idempotent
    await redis.aclose()


async def test_shutdown_drain_deadline() -> None:
    server = Server()
    slow = Slow()
    server.register(slow)
    call = asyncio.create_task(server.dispatcher.dispatch(Message(service_path="Slow", service_method="Work", payload=b"1")))
    await slow.first_started.wait()
    assert await server.shutdown(None, timeout=0.05) is False
    slow.release.set()
    assert (await call).reply.payload == b"2"


async def test_register_function_and_plugins() -> None:
    server = Server()

    async def ping(ctx: Context, args: Any) -> str:
        return "pong"

    server.register_function("Util", ping)

    class Tag:
        def pre_write(self, ctx, req, res):
            res.metadata["server"] = "x"

    server.add_plugin(Tag())
    out = await server.dispatcher.dispatch(Message(service_path="Util", service_method="ping", payload=b"null"))
    assert out.reply.payload == b'"pong"' and out.reply.metadata == {"server": "x"}
    await server.shutdown()
