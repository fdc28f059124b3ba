"""A balancer process: the service (data plane, health checks, reload) and,
when configured, the admin endpoint on top of it; what ``juggler balancer``
runs under ``cli.lifecycle``."""

from __future__ import annotations

import os


from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from balancer.config import BalancerConfig, parse_hostport
from balancer.service import LoadBalancer

if TYPE_CHECKING:
    from balancer.admin import AdminServer

__all__ = ["BalancerProcess"]


class BalancerProcess:
    """``await start()``, then ``drain()`` (stop accepting, finish in-flight
    requests within ``drain_timeout``) or ``abort()``; ``reload()`` as SIGHUP."""

    def __init__(self, config: BalancerConfig, *, config_path: str | os.PathLike[str] | None = None,
                 drain_timeout: float = 30.0,
                 overrides: Callable[[BalancerConfig], BalancerConfig] | None = None) -> None:
        self.lb = LoadBalancer(config, config_path=config_path, overrides=overrides)
        self.drain_timeout = drain_timeout
        self.admin: AdminServer | None = None

    async def start(self) -> None:
        await self.lb.start()
        admin = self.lb.config.admin
        if admin is not None:
            from balancer.admin import AdminServer  # aiohttp: loaded only when an admin endpoint is asked for

            host, port = parse_hostport(admin, "admin")
            self.admin = AdminServer(self.lb, host, port)
            try:
                await self.admin.start()
            except BaseException:
                self.admin = None
                await self.lb.aclose()
                raise

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

    async def drain(self) -> None:
        await self._close_admin()
        await self.lb.drain(self.drain_timeout)

    async def abort(self) -> None:
        await self.lb.abort()

    async def aclose(self) -> None:
        await self._close_admin()
        await self.lb.aclose()

    async def _close_admin(self) -> None:
        if self.admin is not None:
            await self.admin.aclose()
            self.admin = None

    async def __aenter__(self) -> BalancerProcess:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()
