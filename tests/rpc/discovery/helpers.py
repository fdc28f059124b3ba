"""Shared helpers of the discovery tests: wait for a discovery to reach a state."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from rpc.discovery.base import Discovery


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
