"""Real processes on free loopback ports, and waiting for conditions, shared
by every test area.

Import as ``from tests.netutil import free_port, wait_for_port, start_redis, wait_until``
(the repository root is on pytest's path, see pyproject.toml).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import queue
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

import pytest


async def wait_until(
    predicate: Callable[[], Any], timeout: float = 10.0, *, interval: float = 0.01,
    what: str | Callable[[], str] = "",
) -> Any:
    """Poll ``predicate()`` until it returns something truthy and return that.

    The predicate may be a plain function or return an awaitable (a Redis
    query, an HTTP scrape in a thread). It is checked once at once, then every
    ``interval`` seconds (0: every loop turn); after ``timeout`` seconds the
    test fails with an AssertionError naming ``what`` (a string, or a function
    giving one then, e.g. a process's output). Use it where another party (a
    server, a task, a process) has to get somewhere first; never a bare sleep.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            said = what() if callable(what) else what
            raise AssertionError(f"not reached within {timeout}s: {said or getattr(predicate, '__name__', predicate)}")
        await asyncio.sleep(interval)


# Ports handed out by free_port() in this test process: the kernel may give
# the port of a just-closed probe socket to the next probe, and two servers
# of one test told the same port fail to start (seen in CI).
_handed_out: set[int] = set()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now, never one this process was given before."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port
    raise RuntimeError("no fresh free port after 100 tries")


def wait_for_port(port: int, timeout: float = 10.0, proc: subprocess.Popen | None = None) -> None:
    """Block until something accepts on 127.0.0.1:port (bounded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")


class LogLines:
    """The lines a process writes to ``stream`` (its stdout or stderr, opened in
    text mode), read by a thread of their own: every line is kept in ``log``,
    and ``wait(needle)`` returns the next one containing ``needle`` -- how a
    test knows a process got somewhere from its own log, never from a sleep."""

    def __init__(self, stream: IO[str], name: str) -> None:
        self.name = name
        self.log: list[str] = []
        self._stream = stream
        self._lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self._stream:
            self.log.append(line.rstrip("\n"))
            self._lines.put(line.rstrip("\n"))

    def wait(self, needle: str, timeout: float = 10.0) -> str:
        """The next line containing ``needle`` (the lines before it are passed over)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"{self.name} did not log {needle!r} within {timeout} s; log: "
                                     f"{self.log[-30:]}") from None
            if needle in line:
                return line

    def close(self) -> None:
        """Once the process is gone: wait for the reader (it ends at EOF), close the stream."""
        self._reader.join(timeout=10)
        self._stream.close()


@dataclass
class ServerProcess:
    """A server process of the tests, on ``port``, with its working ``dir``."""

    port: int
    proc: subprocess.Popen
    dir: str

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` s. Idempotent."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


class RedisServer(ServerProcess):
    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"


def redis_tls_args(leaf: Any, ca: str, *, auth_clients: bool = False) -> list[str]:
    """redis-server options serving TLS with ``leaf`` (a tests.tlsutil.Leaf);
    with ``auth_clients``, clients must present a certificate signed by ``ca``."""
    return [
        "--tls-cert-file", str(leaf.cert), "--tls-key-file", str(leaf.key), "--tls-ca-cert-file", str(ca),
        "--tls-auth-clients", "yes" if auth_clients else "no",
    ]


def start_redis(extra: list[str] | None = None, port: int | None = None) -> RedisServer:
    """Start a real redis-server on a free loopback port, without persistence."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.fail("redis-server is not installed (the README's test command installs it)")
    port = port or free_port()
    workdir = tempfile.mkdtemp(prefix="redis-")
    args = [
        exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
        "--dir", workdir, "--logfile", os.path.join(workdir, "redis.log"), *(extra or []),
    ]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_port(port, proc=proc)
    return RedisServer(port=port, proc=proc, dir=workdir)
