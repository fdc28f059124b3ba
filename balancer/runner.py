"""A balancer process: the service (data plane, health checks, reload) and,
when configured, the admin endpoint and the handover socket on top of it;
what ``juggler balancer`` runs under ``cli.lifecycle``."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from rustext.service import ServiceBase

from balancer.checks import parse_hostport
from balancer.config import BalancerConfig
from balancer.errors import BalancerError
from balancer.service import LoadBalancer

if TYPE_CHECKING:
    from balancer.admin import AdminServer
    from balancer.handover import HandoverServer

log = logging.getLogger("balancer.runner")

#: seconds a new process waits for the admin port of the process it replaces
ADMIN_TAKEOVER_WAIT = 5.0

__all__ = ["BalancerProcess"]


class BalancerProcess(ServiceBase):
    """``await start()``, then ``drain()`` (stop accepting, finish in-flight
    requests within ``drain_timeout``) or ``abort()``; ``reload()`` as SIGHUP."""

    def __init__(self, config: BalancerConfig, *, config_path: str | os.PathLike[str] | None = None,
                 drain_timeout: float = 30.0,
                 overrides: Callable[[BalancerConfig], BalancerConfig] | None = None) -> None:
        self.lb = LoadBalancer(config, config_path=config_path, overrides=overrides, drain_timeout=drain_timeout)
        self.drain_timeout = drain_timeout
        self.admin: AdminServer | None = None
        self.handover: HandoverServer | None = None
        self._taken_over = asyncio.Event()

    async def start(self, takeover: str | None = None) -> None:
        """Bind and serve. ``takeover``: the handover socket of a running
        balancer whose listeners this process takes (a binary upgrade); the
        running one is told to drain only once this one serves, and keeps
        serving if this start fails (HandoverError, or any other error)."""
        from balancer.handover import Takeover, close_fds

        taker = Takeover(takeover) if takeover is not None else None
        inherited: dict[str, list[int]] = {}
        try:
            if taker is not None:
                await asyncio.to_thread(taker.connect)
                inherited = await asyncio.to_thread(taker.listeners)
            await self.lb.start(inherited)
            try:
                if taker is None:
                    await self._start_admin(wait=0.0)
                    await self._start_handover()
                    return
                await asyncio.to_thread(taker.drain)
            except BaseException:
                await self.aclose()
                raise
            log.info("took over the listeners of the balancer at %s; it drains and exits", takeover)
            # the old process is draining now: this one serves, whatever else fails
            try:
                await self._start_admin(wait=ADMIN_TAKEOVER_WAIT)
            except OSError as exc:
                log.error("the admin endpoint is not started: %s", exc)
            try:
                await self._start_handover()
            except BalancerError as exc:
                log.error("no handover socket for the next upgrade: %s", exc)
        finally:
            close_fds(inherited)
            if taker is not None:
                taker.close()

    async def _start_admin(self, wait: float) -> None:
        """The admin endpoint; after a takeover its port may still be the old
        process's for a moment (it closes it as its drain starts)."""
        admin = self.lb.config.admin
        if admin is None:
            return
        from rustext.net import ListenError

        from balancer.admin import AdminServer  # aiohttp: loaded only when an admin endpoint is asked for

        host, port = parse_hostport(admin, "admin")
        deadline = asyncio.get_running_loop().time() + wait
        while True:
            server = AdminServer(self.lb, host, port)
            try:
                await server.start()
            except ListenError:
                if asyncio.get_running_loop().time() >= deadline:
                    raise
                await asyncio.sleep(0.05)  # polling a port another process frees: no event to await
                continue
            self.admin = server
            return

    async def _start_handover(self) -> None:
        path = self.lb.config.handover_socket
        if path is None:
            return
        from balancer.handover import HandoverServer

        self.handover = HandoverServer(path, self.lb.listener_sockets, self._handed_over)
        await self.handover.start()

    def _handed_over(self) -> None:
        self.lb.handed_over()
        self._taken_over.set()

    async def taken_over(self) -> int:
        """Returns 0 once another process took the listeners over (then drain)."""
        await self._taken_over.wait()
        return 0

    @property
    def admin_address(self) -> tuple[str, int] | None:
        return self.admin.address if self.admin is not None else None

    def draining(self) -> str:
        # requests whose response has not started; idle keep-alive connections are closed at once,
        # and counting them would make a just-closed probe connection look like work in flight
        s = self.lb.stats()
        n = max(0, s["requests"] - sum(s["responses"].values()))
        if not n:
            return ""
        return f"draining {n} request{'s' if n != 1 else ''} for up to {self.drain_timeout:g} s"

    async def drain(self, timeout: float | None = None) -> None:
        """Close the admin endpoint and the handover socket, then drain the
        balancer (`timeout` s, None: ``drain_timeout``)."""
        await self._close_admin()
        await self._close_handover()
        await self.lb.drain(timeout)

    def abort(self) -> None:
        self.lb.abort()

    async def _close_handover(self) -> None:
        if self.handover is not None:
            await self.handover.aclose()
            self.handover = None

    async def _close_admin(self) -> None:
        if self.admin is not None:
            await self.admin.aclose()
            self.admin = None
