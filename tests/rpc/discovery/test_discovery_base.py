"""rpc.discovery.base.WatchingDiscovery without a registry: closing ends its
loops even when the registry client swallows the cancellation; the first
answer after an outage does not drop known servers at once."""

from __future__ import annotations

import asyncio

import pytest

from rpc.discovery.base import WatchingDiscovery
from rpc.errors import RegistryUnavailable


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


class Scripted(WatchingDiscovery):
    """A registry whose answers the test gives, one fetch at a time (None: unreachable), on the test's clock."""

    def __init__(self, grace: float) -> None:
        super().__init__(refresh_interval=3600, outage_grace=grace)
        self.answer: dict[str, str] | None = {}
        self.now = 0.0
        self._clock = lambda: self.now

    async def _fetch(self) -> dict[str, str]:
        if self.answer is None:
            raise RegistryUnavailable("gone")
        return dict(self.answer)


A, B, C = "tcp@127.0.0.1:1", "tcp@127.0.0.1:2", "tcp@127.0.0.1:3"


async def test_servers_left_out_right_after_an_outage_are_kept_for_the_grace() -> None:
    d = Scripted(grace=30)
    d.answer = {A: "", B: ""}
    assert await d.refresh() and set(d.servers()) == {A, B}
    d.answer = None  # the registry gone: the servers' entries expire meanwhile
    assert not await d.refresh() and set(d.servers()) == {A, B}
    d.answer, d.now = {}, 10.0  # back, empty: nothing dropped yet
    assert await d.refresh() and set(d.servers()) == {A, B}
    d.answer, d.now = {A: "weight=2", C: ""}, 12.0  # A registered again, and a new server
    assert await d.refresh() and d.servers() == {A: "weight=2", B: "", C: ""}
    d.now = 39.0
    assert await d.refresh() and set(d.servers()) == {A, B, C}
    d.now = 40.0  # B never came back: dropped once the grace is over
    assert await d.refresh() and set(d.servers()) == {A, C}
    d.answer = {A: ""}  # no outage in between: the registry is followed at once
    assert await d.refresh() and set(d.servers()) == {A}


async def test_a_server_that_registers_again_is_no_longer_held() -> None:
    d = Scripted(grace=30)
    d.answer = {A: "", B: ""}
    await d.refresh()
    d.answer = None
    await d.refresh()
    d.answer = {A: ""}
    await d.refresh()
    d.answer = {A: "", B: ""}  # B back: later, the registry decides for it again
    await d.refresh()
    d.answer = {A: ""}
    assert await d.refresh() and set(d.servers()) == {A}


async def test_no_grace_follows_the_registry_at_once() -> None:
    d = Scripted(grace=0)
    d.answer = {A: ""}
    await d.refresh()
    d.answer = None
    await d.refresh()
    d.answer = {}
    assert await d.refresh() and d.servers() == {}
    with pytest.raises(ValueError):
        Scripted(grace=-1)


class Overtaken(Scripted):
    """The first fetch hangs until the test lets it fail; the others answer at once."""

    def __init__(self) -> None:
        super().__init__(grace=30)
        self.release = asyncio.Event()
        self.slow = True

    async def _fetch(self) -> dict[str, str]:
        if self.slow:
            self.slow = False
            await self.release.wait()
            raise RegistryUnavailable("timed out")
        return await super()._fetch()


async def test_a_slow_fetch_failing_after_a_later_success_is_no_outage() -> None:
    d = Overtaken()
    d._servers = {A: "", B: ""}
    d.answer = {A: "", B: ""}
    slow = asyncio.ensure_future(d.refresh())
    await asyncio.sleep(0)  # the slow fetch begun
    assert await d.refresh()  # a later one succeeds
    d.release.set()
    assert not await asyncio.wait_for(slow, 5)  # then the slow one fails
    d.answer = {A: ""}  # B unregisters: followed at once, no outage came in between
    assert await d.refresh() and set(d.servers()) == {A}
