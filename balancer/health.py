"""Active health checks, run from asyncio.

Each backend gets one task that sends ``GET <path>`` on a fresh connection
every ``interval`` (bounded by ``timeout``); a 2xx/3xx answer is a success
(redirects are not followed). The HTTP client is aiohttp; a backend that
expects a PROXY protocol header (``send_proxy``) is checked over a raw
connection that starts with one naming no client (v2 ``LOCAL``, v1
``UNKNOWN``), as HAProxy's checks of such servers do.
After ``rise`` successes in a row a down backend is marked up, after
``fall`` failures in a row an up backend is marked down; every transition
calls ``on_change(name, healthy)`` (the service forwards it to the data
plane). Backends start up, as the data plane assumes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import aiohttp

from balancer.config import HealthCheck, parse_hostport, unix_path

log = logging.getLogger("balancer.health")


async def probe(session: aiohttp.ClientSession, address: str, check: HealthCheck) -> bool:
    """One check: True when the backend answers 2xx/3xx within the timeout."""
    import aiohttp

    host, port = parse_hostport(address, "backend address")
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        async with session.get(
            f"http://{authority}{check.path}",
            headers={"Host": check.host or address, "User-Agent": "juggler-balancer-health"},
            allow_redirects=False,
            timeout=aiohttp.ClientTimeout(total=check.timeout),
        ) as resp:
            return 200 <= resp.status < 400
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
        return False


#: The PROXY header of a health check: the balancer's own connection, no client.
CHECK_PROXY_HEADERS = {
    "v1": b"PROXY UNKNOWN\r\n",
    "v2": b"\r\n\r\n\x00\r\nQUIT\n\x20\x00\x00\x00",
}


async def probe_raw(address: str, check: HealthCheck, version: str | None) -> bool:
    """``probe`` over a plain connection: for a backend on a Unix socket, or
    one that expects a PROXY header (``version``) first."""
    path = unix_path(address)

    async def once() -> bool:
        if path is not None:
            reader, writer = await asyncio.open_unix_connection(path)
        else:
            reader, writer = await asyncio.open_connection(*parse_hostport(address, "backend address"))
        try:
            writer.write(CHECK_PROXY_HEADERS.get(version or "", b"") + (
                f"GET {check.path} HTTP/1.1\r\nHost: {check.host or ('localhost' if path else address)}\r\n"
                "User-Agent: juggler-balancer-health\r\nConnection: close\r\n\r\n").encode("latin-1"))
            await writer.drain()
            status = (await reader.readline()).split()
            return len(status) >= 2 and status[0].startswith(b"HTTP/") and status[1].isdigit() \
                and 200 <= int(status[1]) < 400
        finally:
            writer.close()

    try:
        return await asyncio.wait_for(once(), check.timeout)
    except (OSError, TimeoutError, ValueError, UnicodeError):
        return False


class HealthChecker:
    """Runs one probe task per backend; ``set_backends`` follows reloads."""

    def __init__(self, check: HealthCheck, on_change: Callable[[str, bool], None]) -> None:
        self.check = check
        self._on_change = on_change
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.healthy: dict[str, bool] = {}
        self._session: aiohttp.ClientSession | None = None
        #: backend address → ``"v1"`` / ``"v2"`` for those checked with a PROXY header
        self.send_proxy: dict[str, str | None] = {}

    def _client(self) -> aiohttp.ClientSession:
        import aiohttp  # loaded only when health checks are configured

        if self._session is None:
            # a fresh connection per check: a backend's listener is what is tested
            connector = aiohttp.TCPConnector(force_close=True, limit=0)
            self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        return self._session

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
            version = self.send_proxy.get(name)
            if (version is not None and version in CHECK_PROXY_HEADERS) or unix_path(name) is not None:
                ok = await probe_raw(name, self.check, version)
            else:
                ok = await probe(self._client(), name, self.check)
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
        if self._session is not None:
            await self._session.close()
            self._session = None
