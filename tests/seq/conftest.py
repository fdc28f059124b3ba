"""Fixtures for seq: real `juggler seq server` processes on free loopback ports."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator

import pytest

from seq.localcluster import LocalCluster


def start_cluster(tmp_path_factory: pytest.TempPathFactory, *flags: str) -> LocalCluster:
    c = LocalCluster(3, root=str(tmp_path_factory.mktemp("seq")))
    c.start_all("--bootstrap", *flags)
    try:
        asyncio.run(c.wait_ready(timeout=60))
    except BaseException:
        c.close()
        raise
    return c


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A healthy 3-member cluster shared by a module's tests (they use distinct names)."""
    c = start_cluster(tmp_path_factory)
    yield c
    c.close()


@pytest.fixture
def make_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Awaitable[LocalCluster]]]:
    """``await make_cluster(*flags)``: a 3-member cluster started with extra server flags; closed after the test."""
    made: list[LocalCluster] = []

    async def make(*flags: str) -> LocalCluster:
        c = LocalCluster(3, root=str(tmp_path_factory.mktemp("seq")))
        made.append(c)
        c.start_all("--bootstrap", *flags)
        await c.wait_ready(timeout=60)
        return c

    yield make
    for c in made:
        c.close()


@pytest.fixture
def fresh_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A 3-member cluster of its own, for tests that kill, wipe and restart members."""
    c = start_cluster(tmp_path_factory)
    yield c
    c.close()
