"""rpc.discovery.base.WatchingDiscovery without a registry: closing ends its
loops even when the registry client swallows the cancellation."""

from __future__ import annotations

import asyncio

from rpc.discovery.base import WatchingDiscovery


class Swallowing(WatchingDiscovery):
    """A registry client that, like redis-py's asyncio client, returns a
    reply to a command cancelled in flight instead of raising CancelledError."""

    def __init__(self) -> None:
        super().__init__(refresh_interval=0.01)
        self.fetching = asyncio.Event()

    async def _fetch(self) -> dict[str, str]:
        self.fetching.set()
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            pass  # swallowed: the reply "arrives" anyway
        return {"tcp@127.0.0.1:1": ""}

    async def _watch(self, changed: asyncio.Event) -> None:
        changed.set()
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            pass


async def test_aclose_ends_loops_whose_cancellation_was_swallowed() -> None:
    d = Swallowing()
    await d.start()
    d.fetching.clear()
    await asyncio.wait_for(d.fetching.wait(), 5)  # a refresh is in flight
    await asyncio.wait_for(d.aclose(), 5)
    assert d._tasks == []
