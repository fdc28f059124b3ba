"""Every long-running part of the suite has the one lifecycle of
``rustext.service``: start, drain(timeout), aclose, abort, async with."""

from __future__ import annotations

import importlib

import pytest

from rustext.service import check_service

SERVICES = (
    "juggler.server.Server",
    "juggler.callee.Callee",
    "juggler.runner.Running",
    "juggler.runner.CalleeProcess",
    "balancer.service.LoadBalancer",
    "balancer.runner.BalancerProcess",
    "rpc.runner.RpcProcess",
    "seq.server.RRServer",
    "seq.worker.SnowflakeWorker",
    "seq.runner.MemberProcess",
)


@pytest.mark.parametrize("path", SERVICES)
def test_the_one_lifecycle(path: str) -> None:
    module, _, name = path.rpartition(".")
    assert check_service(getattr(importlib.import_module(module), name)) == []


def test_check_service_names_what_is_missing() -> None:
    class Half:
        async def start(self) -> None: ...

        async def drain(self, timeout: float = 3.0) -> None: ...

        async def abort(self) -> None: ...

    problems = check_service(Half)
    assert "no aclose()" in problems and "no __aenter__()" in problems
    assert "abort() is async (it must be a plain method)" in problems
    assert "drain() must take timeout=None" in problems


async def test_abort_and_drain_are_safe_before_start_and_twice() -> None:
    from balancer.config import from_dict
    from balancer.service import LoadBalancer
    from juggler.broker.memory import MemoryBroker
    from juggler.callee import Callee, make_test_app
    from juggler.config import ServerConfig
    from juggler.server import Server

    broker = MemoryBroker()
    await broker.start()
    server = Server(broker, ServerConfig(port=0))
    server.abort()
    server.abort()
    await server.drain(0)
    await server.aclose()
    callee = Callee(broker, make_test_app())
    callee.abort()
    await callee.drain(0)
    await callee.aclose()
    lb = LoadBalancer(from_dict({"listen": "127.0.0.1:0", "backends": ["127.0.0.1:1"], "workers": 1}))
    async with lb:
        lb.abort()
        lb.abort()
    await broker.aclose()
