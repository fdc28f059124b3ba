"""Shared helpers of the discovery tests: wait for a discovery to reach a
state; a registered server killed with SIGKILL; registered in-process
servers for an XClient."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

from rpc.discovery.base import Discovery, Registrar
from rpc.inprocess import InProcessNetwork
from rpc.service import Context, ServiceDispatcher


async def wait_servers(discovery: Discovery, pred: Callable[[dict[str, str]], bool], timeout: float = 5.0) -> dict[str, str]:
    """Wait (event-driven, bounded) until ``pred(servers)`` holds."""
    if pred(discovery.servers()):
        return discovery.servers()
    done = asyncio.Event()

    def on_change(servers: dict[str, str]) -> None:
        if pred(servers):
            done.set()

    unsubscribe = discovery.subscribe(on_change)
    try:
        if pred(discovery.servers()):
            return discovery.servers()
        async with asyncio.timeout(timeout):
            await done.wait()
    finally:
        unsubscribe()
    return discovery.servers()


async def assert_killed_server_expires(
    discovery: Discovery, register_forever: str, args: list[str], address: str, expiry: float
) -> None:
    """Run ``register_forever`` (a Python script registering ``address``,
    printing "registered", then waiting) in its own process; once
    ``discovery`` sees the address, SIGKILL the process: with no
    deregistration the registry's expiry alone must remove it within
    ``expiry`` seconds. Closes ``discovery``."""
    proc = subprocess.Popen([sys.executable, "-c", register_forever, *args], stdout=subprocess.PIPE, cwd=os.getcwd())
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 20)
        assert line.strip() == b"registered"
        await discovery.start()
        assert address in await wait_servers(discovery, lambda s: address in s)
        os.kill(proc.pid, signal.SIGKILL)
        assert await wait_servers(discovery, lambda s: address not in s, timeout=expiry) == {}
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=5)
        proc.stdout.close()
        await discovery.aclose()


class Node:
    """Service ``Node``: ``Who`` answers the server's name."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def Who(self, ctx: Context, args: Any) -> str:
        return self.name


@contextlib.asynccontextmanager
async def node_servers(registrar: Registrar, addresses: Iterable[str]) -> AsyncIterator[InProcessNetwork]:
    """One in-process ``Node`` server per address (named by the address's
    last four characters), each registered with ``registrar``; yields their
    network, closed with the servers on exit."""
    net = InProcessNetwork()
    dispatchers: list[ServiceDispatcher] = []
    try:
        for addr in addresses:
            d = ServiceDispatcher()
            d.registry.register(Node(addr[-4:]), "Node")
            net.add(addr, d)
            dispatchers.append(d)
            await registrar.register("Node", addr)
        yield net
    finally:
        await net.aclose()
        for d in dispatchers:
            await d.aclose()
