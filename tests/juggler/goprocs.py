"""The original Go juggler programs as real subprocesses, for the interop tests.

The binaries are named by environment variables (``JUGGLER_GO_SERVER``,
``JUGGLER_GO_CLIENT``, ``JUGGLER_GO_CALLEE``, ``JUGGLER_GO_LOAD``); the
tests that need one are skipped without it. The Go client is an
interactive terminal program (it puts its standard input in raw mode), so
:class:`GoRepl` drives it through a pseudo-terminal, as a person would.
"""

from __future__ import annotations

import asyncio
import os
import pty
import re
import select
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.netutil import free_port, wait_for_port

GO_SERVER = os.environ.get("JUGGLER_GO_SERVER")
GO_CLIENT = os.environ.get("JUGGLER_GO_CLIENT")
GO_CALLEE = os.environ.get("JUGGLER_GO_CALLEE")
GO_LOAD = os.environ.get("JUGGLER_GO_LOAD")

_ANSI = re.compile(rb"\x1b\[[0-9;]*[A-Za-z]")


def redis_addr(redis_url: str) -> str:
    """host:port of a redis:// URL (the Go programs take an address, not a URL)."""
    return redis_url.removeprefix("redis://").split("/")[0]


class _Logged:
    """A subprocess whose output goes to a temp file (read it on failure)."""

    def __init__(self, args: list[str]) -> None:
        self.log = tempfile.NamedTemporaryFile(prefix="go-juggler-", suffix=".log", delete=False)  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def output(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()
        os.unlink(self.log.name)


@contextmanager
def go_server(redis_url: str) -> Iterator[str]:
    """The original ``juggler-server`` on a free port (logging on, to its temp
    file); yields its ws URL once it accepts connections."""
    assert GO_SERVER is not None
    port = free_port()
    p = _Logged([GO_SERVER, "-port", str(port), "-redis", redis_addr(redis_url)])
    try:
        try:
            wait_for_port(port, timeout=10, proc=p.proc)
        except Exception as exc:
            raise RuntimeError(f"juggler-server did not start: {exc}\n{p.output()}") from exc
        yield f"ws://127.0.0.1:{port}/ws"
    finally:
        p.stop()


@contextmanager
def go_callee(redis_url: str) -> Iterator[_Logged]:
    """The original ``juggler-callee`` (test.echo, test.reverse, test.delay),
    its debug endpoint on a free loopback port; yields once it serves."""
    assert GO_CALLEE is not None
    port = free_port()
    p = _Logged([GO_CALLEE, "-redis", redis_addr(redis_url), "-port", str(port)])
    try:
        wait_for_port(port, timeout=10, proc=p.proc)  # listening for calls comes right after
        yield p
    finally:
        p.stop()


def go_load(url: str, *args: str, timeout: float = 60) -> str:
    """Run the original ``juggler-load`` against ``url`` and return its report
    (pass ``-V`` where the server has no ``/debug/vars`` page)."""
    assert GO_LOAD is not None
    out = subprocess.run([GO_LOAD, "-addr", url, *args], check=False, capture_output=True, text=True,
                         timeout=timeout)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout + out.stderr


def load_server_diffs(report: str) -> dict[str, int]:
    """The server counters' differences (after - before) of a report read from /debug/vars."""
    return {k: int(v) for k, v in re.findall(r"^(\w+):\s+\d+\s+\d+\s+(-?\d+)$", report, re.MULTILINE)}


def load_counts(report: str) -> dict[str, int]:
    """The client statistics of a ``juggler-load`` report: Calls, Acks, Nacks, Results, Expired."""
    return {k: int(v) for k, v in re.findall(r"^(Calls|Acks|Nacks|Results|Expired):\s+(\d+)$", report, re.MULTILINE)}


class GoRepl:
    """The original ``juggler-client`` in a pseudo-terminal: type commands,
    wait for what it prints."""

    def __init__(self, url: str) -> None:
        assert GO_CLIENT is not None
        master, slave = pty.openpty()
        self._fd = master
        self.proc = subprocess.Popen([GO_CLIENT, "-addr", url], stdin=slave, stdout=slave, stderr=slave,
                                     close_fds=True)
        os.close(slave)
        self._buf = b""
        self._seen = 0  # expect() looks past what an earlier expect() matched

    def text(self) -> str:
        """Everything printed so far, terminal escapes removed."""
        return _ANSI.sub(b"", self._buf).replace(b"\r", b"").decode(errors="replace")

    def _read(self, timeout: float) -> None:
        ready, _, _ = select.select([self._fd], [], [], timeout)
        if ready:
            try:
                self._buf += os.read(self._fd, 65536)
            except OSError:  # the program is gone (EIO on the master)
                pass

    def send(self, line: str) -> None:
        os.write(self._fd, line.encode() + b"\r")

    def expect_sync(self, pattern: str, timeout: float = 10) -> re.Match[str]:
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            m = regex.search(self.text(), self._seen)
            if m:
                self._seen = m.end()
                return m
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                raise AssertionError(f"juggler-client never printed {pattern!r}; it printed:\n{self.text()}")
            self._read(min(left, 0.2))

    async def expect(self, pattern: str, timeout: float = 10) -> re.Match[str]:
        """The first match of ``pattern`` printed after the previous match (the
        wait runs in a thread: the test's own clients keep being served)."""
        return await asyncio.to_thread(self.expect_sync, pattern, timeout)

    def exit(self) -> int:
        """Ctrl-D, as a person leaves it; its exit status."""
        if self.proc.poll() is None:
            os.write(self._fd, b"\x04")
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        os.close(self._fd)
        return self.proc.returncode
