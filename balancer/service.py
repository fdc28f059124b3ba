"""The balancer as a service: data plane + health checks + reload.

Lifecycle: ``await lb.start()`` → serving; ``await lb.reload()`` (SIGHUP or
the admin endpoint's ``POST /reload``) re-reads the file and swaps backends
and policy without dropping a connection, or raises BalancerConfigError and
keeps the running configuration; ``await lb.drain(timeout)`` stops accepting
and waits for in-flight requests; ``await lb.aclose()`` stops at once. All
idempotent. The admin endpoint (balancer.admin) and the process around both
(balancer.runner) sit on top of this module.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
from typing import Any

import rustext

from balancer import config as config_mod
from balancer.config import BalancerConfig
from balancer.errors import BalancerConfigError
from balancer.health import HealthChecker

log = logging.getLogger("balancer.service")


class LoadBalancer:
    def __init__(self, config: BalancerConfig, *, config_path: str | os.PathLike[str] | None = None) -> None:
        self.config = config
        self.config_path = config_path
        self._native = rustext.Balancer(config.to_native())
        self._health: dict[str, HealthChecker] = {}  # per backend pool with checks
        self._reload_lock = asyncio.Lock()
        self._closed = asyncio.Event()
        self._started = False

    # --- lifecycle -------------------------------------------------------
    async def start(self) -> None:
        if self._started:
            raise RuntimeError("start() may be called once")
        self._started = True
        self._native.start()
        await self._sync_health(self.config)
        scheme = "https" if self._native.tls else "http"
        redirect = self._native.redirect_address
        extra = f", http://{redirect[0]}:{redirect[1]} redirects to https" if redirect else ""
        extra += ", TLS to backends" if self.config.tls.backend else ""
        pools = self.config.pools()
        log.info(
            "balancer listening on %s://%s:%d (%d workers, %s%s) over %d backends%s",
            scheme, *self.address, self._native.workers, self.config.algorithm, extra,
            sum(len(p.backends) for p in pools.values()),
            f" in {len(pools)} pools" if self.config.named_backends else "",
        )
        for (host, port), listener in list(zip(self.addresses, self.config.effective_listeners()))[1:]:
            log.info("also listening on %s://%s:%d", "https" if listener.tls else "http", host, port)

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """(host, port) of every listener, in the order configured."""
        return [(a[0], a[1]) for a in self._native.addresses]

    def _mark_health(self, pool: str, name: str, healthy: bool) -> None:
        self._native.set_backend_health(name, healthy, pool)

    async def _sync_health(self, cfg: BalancerConfig) -> None:
        """One health checker per pool with checks, following ``cfg``."""
        pools = cfg.pools()
        for name in list(self._health):
            pool = pools.get(name)
            if pool is None or pool.health is None:
                await self._health.pop(name).aclose()
                for b in pool.backends if pool is not None else ():
                    self._native.set_backend_health(b.address, True, name)
        for name, pool in pools.items():
            if pool.health is None:
                continue
            checker = self._health.get(name)
            if checker is None:
                checker = self._health[name] = HealthChecker(pool.health, functools.partial(self._mark_health, name))
                checker.set_backends(b.address for b in pool.backends)
            else:
                checker.set_backends((b.address for b in pool.backends), pool.health)

    @property
    def redirect_address(self) -> tuple[str, int] | None:
        """(host, port) of the plain-HTTP listener redirecting to HTTPS, if any."""
        addr = self._native.redirect_address
        return None if addr is None else (addr[0], addr[1])

    @property
    def address(self) -> tuple[str, int]:
        addr = self._native.address
        if addr is None:
            raise RuntimeError("not started")
        return addr

    async def drain(self, timeout: float = 30.0) -> None:
        """Stop accepting, finish in-flight requests within ``timeout``, stop."""
        await self._stop_control()
        await asyncio.to_thread(self._native.drain, timeout)
        self._closed.set()

    async def aclose(self) -> None:
        await self._stop_control()
        await asyncio.to_thread(self._native.close)
        self._closed.set()

    async def abort(self) -> None:
        """Cut a :meth:`drain` under way short: in-flight exchanges end now."""
        await asyncio.to_thread(self._native.close)

    async def _stop_control(self) -> None:
        checkers, self._health = list(self._health.values()), {}
        for checker in checkers:
            await checker.aclose()

    async def __aenter__(self) -> LoadBalancer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # --- reconfiguration -------------------------------------------------
    async def reload_logged(self) -> None:
        """:meth:`reload`, logging a rejected file instead of raising (SIGHUP)."""
        try:
            await self.reload()
        except BalancerConfigError as exc:
            log.error("reload rejected, keeping the running configuration: %s", exc)

    def _reload_tls(self) -> None:
        """The certificate files again: new handshakes get them, established
        connections keep theirs; on error the current ones stay."""
        try:
            self._native.reload_tls()
        except BalancerConfigError as exc:
            raise BalancerConfigError(f"TLS certificates not reloaded: {exc}") from exc
        log.info("TLS certificates reloaded")

    async def reload(self, new: BalancerConfig | None = None) -> None:
        """Apply ``new`` (or re-read the config file) without dropping connections."""
        async with self._reload_lock:
            if new is None:
                if self.config_path is None:
                    if self._native.tls:  # configured by flags: the certificates are what can change
                        self._reload_tls()
                        return
                    raise BalancerConfigError("no configuration file to reload")
                new = await asyncio.to_thread(config_mod.load, self.config_path)
            if self._native.tls:
                self._reload_tls()
            fixed = self.config.fixed_changes(new)
            if fixed:
                log.warning("reload: %s need a restart; kept as they were", ", ".join(fixed))
            self._native.update(new.to_native())  # raises and keeps the old config on error
            self.config = new
            await self._sync_health(new)
            pools = new.pools()
            log.info("reloaded: %d backends in %d pool(s), %d route(s)", sum(len(p.backends) for p in pools.values()),
                     len(pools), sum(len(x.routes) for x in new.effective_listeners()))

    def set_backend_state(self, name: str, state: str) -> None:
        """Admin state: ``up``, ``drain`` or ``down``."""
        self._native.set_backend_state(name, state)

    def set_backend_weight(self, name: str, weight: int) -> None:
        self._native.set_backend_weight(name, weight)
        self.config = self.config.with_backends(
            [dataclasses.replace(b, weight=weight) if b.address == name else b for b in self.config.backends]
        )

    # --- observation -----------------------------------------------------
    def stats(self) -> dict[str, Any]:
        return self._native.stats()

    def backends(self) -> list[dict[str, Any]]:
        out = self._native.backends()
        for b in out:
            checker = self._health.get(b["pool"])
            b["healthy"] = checker.healthy.get(b["name"], True) if checker is not None else True
        return out
