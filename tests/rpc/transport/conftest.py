"""Fixtures for rpc.transport tests: endpoints of each channel kind, leak checks,
and a real peer process."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from rpc.transport import InProcNetwork
from tests.netutil import wait_until

HERE = os.path.dirname(__file__)


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def inproc() -> InProcNetwork:
    return InProcNetwork()


@pytest.fixture(params=["inproc", "tcp", "unix"])
def endpoint(request: pytest.FixtureRequest) -> Iterator[str]:
    """An endpoint of each channel kind (tcp on port 0: the server binds a free one)."""
    if request.param == "inproc":
        yield "inproc://svc"
    elif request.param == "tcp":
        yield "tcp://127.0.0.1:0"
    else:
        d = tempfile.mkdtemp(prefix="rt-")
        yield f"unix://{d}/s.sock"
        try:
            os.rmdir(d)
        except OSError:
            pass


@pytest.fixture
async def no_leaks() -> AsyncIterator[None]:
    """Fails the test if it leaves tasks running or file descriptors open."""
    before = fd_count()
    yield
    current = asyncio.current_task()

    def left() -> list[asyncio.Task[Any]]:
        return [t for t in asyncio.all_tasks() if t is not current and not t.done()]

    try:  # closing transports and tasks finish within a few loop turns
        await wait_until(lambda: not left() and fd_count() <= before, timeout=2, interval=0.001)
    except AssertionError:
        pass  # the asserts below say what is left
    assert left() == [], f"tasks left running: {left()}"
    assert fd_count() <= before, f"file descriptors leaked: {fd_count() - before}"


class PeerProcess:
    def __init__(self, endpoint: str, mode: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "peer_server.py"), endpoint, mode],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # "listening <endpoint>" once ready
        if not line.startswith("listening "):
            self.kill()
            raise RuntimeError(f"peer server did not start: {line!r}")
        self.endpoint = line.split()[1]

    async def read_line(self, timeout: float = 10.0) -> str:
        """The peer's next line of output (bounded wait)."""
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), timeout)
        assert line, "the peer process exited"
        return line.strip()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def peer_process() -> Iterator[type[PeerProcess]]:
    started: list[PeerProcess] = []

    class Tracked(PeerProcess):
        def __init__(self, endpoint: str, mode: str) -> None:
            super().__init__(endpoint, mode)
            started.append(self)

    yield Tracked
    for p in started:
        p.kill()

