"""Active health checks, run from asyncio.

Each backend gets one task that sends ``GET <path>`` on a fresh connection
every ``interval`` (bounded by ``timeout``); a 2xx/3xx answer is a success.
After ``rise`` successes in a row a down backend is marked up, after
``fall`` failures in a row an up backend is marked down; every transition
calls ``on_change(name, healthy)`` (the service forwards it to the data
plane). Backends start up, as the data plane assumes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from balancer.config import HealthCheck, parse_hostport

log = logging.getLogger("balancer.health")


async def probe(address: str, check: HealthCheck) -> bool:
    """One check: True when the backend answers 2xx/3xx within the timeout."""
    host, port = parse_hostport(address, "backend address")
    writer = None
    try:
        async with asyncio.timeout(check.timeout):
            reader, writer = await asyncio.open_connection(host, port)
            host_header = check.host or address
            writer.write(
                f"GET {check.path} HTTP/1.1\r\nHost: {host_header}\r\nUser-Agent: juggler-balancer-health\r\n"
                "Connection: close\r\n\r\n".encode("latin-1")
            )
            await writer.drain()
            line = await reader.readline()
        parts = line.split(None, 2)
        return len(parts) >= 2 and parts[0].startswith(b"HTTP/1.") and parts[1][:1] in (b"2", b"3")
    except (OSError, TimeoutError, ValueError):
        return False
    finally:
        if writer is not None:
            writer.close()


class HealthChecker:
    """Runs one probe task per backend; ``set_backends`` follows reloads."""

    def __init__(self, check: HealthCheck, on_change: Callable[[str, bool], None]) -> None:
        self.check = check
        self._on_change = on_change
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.healthy: dict[str, bool] = {}

    def set_backends(self, addresses: Iterable[str], check: HealthCheck | None = None) -> None:
        """Start checking new backends and stop checking removed ones."""
        if check is not None and check != self.check:
            self.check = check
            for name in list(self._tasks):
                self._tasks.pop(name).cancel()
        wanted = set(addresses)
        for name in list(self._tasks):
            if name not in wanted:
                self._tasks.pop(name).cancel()
                self.healthy.pop(name, None)
        for name in wanted:
            if name not in self._tasks:
                self.healthy.setdefault(name, True)
                self._tasks[name] = asyncio.create_task(self._run(name), name=f"health {name}")

    async def _run(self, name: str) -> None:
        ok_streak = bad_streak = 0
        while True:
            ok = await probe(name, self.check)
            if ok:
                ok_streak, bad_streak = ok_streak + 1, 0
            else:
                ok_streak, bad_streak = 0, bad_streak + 1
            up = self.healthy.get(name, True)
            if up and bad_streak >= self.check.fall:
                self._set(name, False)
            elif not up and ok_streak >= self.check.rise:
                self._set(name, True)
            await asyncio.sleep(self.check.interval)

    def _set(self, name: str, healthy: bool) -> None:
        self.healthy[name] = healthy
        log.warning("backend %s is %s", name, "up" if healthy else "down")
        try:
            self._on_change(name, healthy)
        except Exception:  # a backend removed by a concurrent reload
            log.exception("cannot mark backend %s", name)

    async def aclose(self) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
