"""Endpoints, configs, registry, the deadline scheduler, and a uvloop run."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rpc.transport import (
    ConnectionConfig,
    ConnectionLost,
    DeadlineScheduler,
    Endpoint,
    InProcNetwork,
    PoolConfig,
    ProtocolRegistry,
    RawCodec,
    RequestTimeout,
    ServerConfig,
    TransportPool,
    TransportProtocol,
    TransportServer,
)
from rpc.transport.wire import FrameWire
from tests.netutil import wait_until

pytestmark = pytest.mark.timeout(60)


def test_endpoint_parse_and_str() -> None:
    assert Endpoint.parse("tcp://127.0.0.1:80") == Endpoint("tcp", host="127.0.0.1", port=80)
    assert Endpoint.parse("tcp://[::1]:9") == Endpoint("tcp", host="::1", port=9)
    assert str(Endpoint.parse("tcp://[::1]:9")) == "tcp://[::1]:9"
    assert Endpoint.parse("unix:///tmp/x.sock").path == "/tmp/x.sock"
    assert str(Endpoint.parse("inproc://a")) == "inproc://a"
    for bad in ("127.0.0.1:80", "tcp://host", "udp://x:1", "unix://", "inproc://"):
        with pytest.raises(ValueError):
            Endpoint.parse(bad)


def test_configs_validate() -> None:
    for kw in ({"send_policy": "drop"}, {"max_handlers": 0}, {"default_timeout": 0}, {"send_queue_bytes": 0}):
        with pytest.raises(ValueError):
            ConnectionConfig(**kw)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ServerConfig(max_handlers=0)
    with pytest.raises(ValueError):
        PoolConfig(backoff_initial=2, backoff_max=1)


def test_registry() -> None:
    reg = ProtocolRegistry.default()
    assert {"rpcx", "rpcx+json", "rpcx+msgpack", "frame", "frame+json", "frame+msgpack"} <= set(reg.names())
    with pytest.raises(KeyError):
        reg.get("nope")
    custom = TransportProtocol("mine", FrameWire(), RawCodec())
    reg.register(custom)
    assert reg.get("mine") is custom
    with pytest.raises(ValueError):
        reg.register(custom)


async def test_scheduler_fires_in_deadline_order_with_one_timer() -> None:
    loop = asyncio.get_running_loop()
    fired: list[str] = []
    done = asyncio.Event()

    def fire(key: str) -> None:
        fired.append(key)
        if len(fired) == 3:
            done.set()

    s = DeadlineScheduler(loop, fire)
    s.add(0.03, "c")
    s.add(0.01, "a")
    h = s.add(0.02, "cancelled")
    s.add(0.02, "b")
    assert s.cancel(h) and not s.cancel(h)
    await asyncio.wait_for(done.wait(), 10)
    assert fired == ["a", "b", "c"]
    assert len(s) == 0
    s.add(10, "left")
    assert s.close() == ["left"]


def test_uvloop_end_to_end() -> None:
    """The production loop: requests, deadlines and connection loss on uvloop."""
    import uvloop

    async def main() -> None:
        async def handler(conn: Any, msg: Any) -> bytes:
            if msg.payload == b"slow":
                await asyncio.sleep(30)
            return msg.payload

        net = InProcNetwork()
        for ep in ("tcp://127.0.0.1:0", "inproc://u"):
            srv = TransportServer(ep, handler, inproc=net, config=ServerConfig(connection=ConnectionConfig(drain_timeout=0.01)))
            await srv.start()
            async with TransportPool(inproc=net) as pool:
                conn = await pool.get(srv.endpoint)
                rs = await asyncio.gather(*(conn.request(bytes([i])) for i in range(100)))
                assert [r.payload for r in rs] == [bytes([i]) for i in range(100)]
                with pytest.raises(RequestTimeout):
                    await conn.request(b"slow", timeout=0.01)
                inflight = asyncio.ensure_future(conn.request(b"slow", timeout=30))
                await wait_until(lambda: conn.in_flight == 1)
                await srv.aclose()
                with pytest.raises(ConnectionLost):
                    await asyncio.wait_for(inflight, 10)

    uvloop.run(main())
