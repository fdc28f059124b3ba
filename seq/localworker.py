"""LocalWorker: one ``juggler seq snowflake`` process on loopback, for tests and benches.

Real process, real ports; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field

import aiohttp

from seq.localcluster import free_ports


@dataclass
class LocalWorker:
    """A worker of the cluster whose members' gRPC addresses are `cluster`; output in `log_path`."""

    cluster: list[str]
    log_path: str
    flags: tuple[str, ...] = ()
    python: str = sys.executable
    addr: str = ""
    http_addr: str = ""
    proc: subprocess.Popen[bytes] | None = None
    runs: int = 0
    _log_offset: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        if not self.addr:
            g, h = free_ports(2)
            self.addr, self.http_addr = f"127.0.0.1:{g}", f"127.0.0.1:{h}"

    @property
    def url(self) -> str:
        return f"http://{self.http_addr}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def command(self, *extra: str) -> list[str]:
        return [self.python, "-P", "-m", "cli", "seq", "snowflake", "--cluster", ",".join(self.cluster),
                "--listen", self.addr, "--http", self.http_addr, *self.flags, *extra]

    def start(self, *extra: str) -> subprocess.Popen[bytes]:
        assert not self.alive, "already running"
        with open(self.log_path, "ab") as logf:
            self._log_offset = logf.seek(0, os.SEEK_END)
            self.proc = subprocess.Popen(self.command(*extra), stdout=logf, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, process_group=0)
        self.runs += 1
        return self.proc

    def kill(self) -> None:
        """kill -9, and reap."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 10.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGCONT)
        self.proc.terminate()
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout)

    def output(self, *, all_runs: bool = False) -> str:
        with open(self.log_path, "rb") as f:
            if not all_runs:
                f.seek(self._log_offset)
            return f.read().decode(errors="replace")

    async def wait_ready(self, session: aiohttp.ClientSession, timeout: float = 30.0) -> dict[str, object]:
        """Until ``/readyz`` says it holds a lease; returns ``/v1/worker``."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"worker exited with {self.proc.returncode}:\n{self.output()[-2000:]}")
            try:
                async with session.get(self.url + "/readyz", timeout=aiohttp.ClientTimeout(total=1)) as r:
                    if r.status == 200:
                        async with session.get(self.url + "/v1/worker") as w:
                            return dict(await w.json())
            except (aiohttp.ClientError, TimeoutError):
                pass
            if loop.time() > end:
                raise TimeoutError(f"worker not ready after {timeout:g} s:\n{self.output()[-2000:]}")
            await asyncio.sleep(0.05)
