"""Fail modes with injected failures (in-process attempts, no network)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from rpc.errors import CallTimeout, NoServerAvailable, ServiceError, TransportError
from rpc.failmode import FailMode, RetryPolicy, execute
from tests.netutil import wait_until

SERVERS = ["s1", "s2", "s3"]


def picker(servers: list[str]) -> Callable[[frozenset[str]], str]:
    """Deterministic: the first server not excluded."""

    def pick(exclude: frozenset[str]) -> str:
        for s in servers:
            if s not in exclude:
                return s
        raise NoServerAvailable("none left")

    return pick


class Servers:
    """Attempt function: per-server behaviour, records every attempt."""

    def __init__(self, behaviour: dict[str, list[object]]) -> None:
        self.behaviour = behaviour
        self.attempts: list[str] = []
        self.cancelled: list[str] = []

    async def __call__(self, addr: str) -> str:
        self.attempts.append(addr)
        plan = self.behaviour.get(addr, ["ok"])
        step = plan.pop(0) if len(plan) > 1 else plan[0]
        try:
            if isinstance(step, asyncio.Event):
                await step.wait()
                return f"late:{addr}"
        except asyncio.CancelledError:
            self.cancelled.append(addr)
            raise
        if isinstance(step, BaseException):
            raise step
        return f"{step}:{addr}"


def down() -> TransportError:
    return TransportError("connection refused")


async def test_failfast_one_try() -> None:
    srv = Servers({"s1": [down()]})
    with pytest.raises(TransportError):
        await execute(FailMode.FAILFAST, RetryPolicy(retries=5), picker(SERVERS), srv)
    assert srv.attempts == ["s1"]


async def test_failover_moves_to_other_servers() -> None:
    srv = Servers({"s1": [down()], "s2": [down()]})
    out = await execute(FailMode.FAILOVER, RetryPolicy(retries=3), picker(SERVERS), srv)
    assert out == "ok:s3" and srv.attempts == ["s1", "s2", "s3"]


async def test_failover_gives_up_after_retries_and_restarts_when_all_tried() -> None:
    srv = Servers({"s1": [down()], "s2": [down()]})
    with pytest.raises(TransportError):
        await execute(FailMode.FAILOVER, RetryPolicy(retries=3), picker(["s1", "s2"]), srv)
    assert srv.attempts == ["s1", "s2", "s1", "s2"]  # retries + 1 tries


async def test_failtry_retries_same_server() -> None:
    srv = Servers({"s1": [down(), down(), "ok"]})
    out = await execute(FailMode.FAILTRY, RetryPolicy(retries=2), picker(SERVERS), srv)
    assert out == "ok:s1" and srv.attempts == ["s1", "s1", "s1"]


@pytest.mark.parametrize("mode", list(FailMode))
async def test_service_errors_are_never_retried(mode: FailMode) -> None:
    srv = Servers({"s1": [ServiceError("bad args")]})
    with pytest.raises(ServiceError, match="bad args"):
        await execute(mode, RetryPolicy(retries=3, backup_latency=1.0), picker(SERVERS), srv)
    assert srv.attempts == ["s1"]


async def test_deadline_bounds_retries_and_intervals() -> None:
    srv = Servers({"s1": [down()]})
    loop = asyncio.get_running_loop()
    with pytest.raises(CallTimeout):
        await execute(FailMode.FAILTRY, RetryPolicy(retries=100, retry_interval=10.0), picker(SERVERS), srv,
                      deadline=loop.time() + 0.05)
    assert srv.attempts == ["s1"]
    hang = Servers({"s1": [asyncio.Event()]})
    with pytest.raises(CallTimeout):
        await execute(FailMode.FAILOVER, RetryPolicy(), picker(SERVERS), hang, deadline=loop.time() + 0.05)
    assert hang.cancelled == ["s1"]


async def test_no_server() -> None:
    with pytest.raises(NoServerAvailable):
        await execute(FailMode.FAILOVER, RetryPolicy(), picker([]), Servers({}))


async def test_failbackup_fast_primary_sends_no_backup() -> None:
    srv = Servers({})
    out = await execute(FailMode.FAILBACKUP, RetryPolicy(backup_latency=5.0), picker(SERVERS), srv)
    assert out == "ok:s1" and srv.attempts == ["s1"]


async def test_failbackup_slow_primary_backup_wins() -> None:
    never = asyncio.Event()
    srv = Servers({"s1": [never]})
    out = await execute(FailMode.FAILBACKUP, RetryPolicy(backup_latency=0.01), picker(SERVERS), srv)
    assert out == "ok:s2" and srv.attempts == ["s1", "s2"]
    await wait_until(lambda: srv.cancelled, what="the losing call cancelled")
    assert srv.cancelled == ["s1"]


async def test_failbackup_primary_failure_sends_backup_at_once() -> None:
    srv = Servers({"s1": [down()]})
    out = await execute(FailMode.FAILBACKUP, RetryPolicy(backup_latency=60.0), picker(SERVERS), srv,
                        deadline=asyncio.get_running_loop().time() + 10)
    assert out == "ok:s2" and srv.attempts == ["s1", "s2"]


async def test_failbackup_both_fail() -> None:
    srv = Servers({"s1": [down()], "s2": [TransportError("reset")]})
    with pytest.raises(TransportError, match="reset"):
        await execute(FailMode.FAILBACKUP, RetryPolicy(backup_latency=0.0), picker(SERVERS), srv)


def test_parse_and_policy_validation() -> None:
    assert FailMode.parse("Failover") is FailMode.FAILOVER
    with pytest.raises(ValueError):
        FailMode.parse("failsafe")
    with pytest.raises(ValueError):
        RetryPolicy(retries=-1)
