"""The balancer as a service: data plane + health checks + reload.

Lifecycle: ``await lb.start()`` → serving; ``await lb.reload()`` (SIGHUP or
the admin endpoint's ``POST /reload``) re-reads the file and swaps backends
and policy without dropping a connection, or raises BalancerConfigError and
keeps the running configuration; ``await lb.drain(timeout)`` stops accepting
and waits for in-flight requests (``aclose()``: the same with
``drain_timeout``); ``lb.abort()`` stops at once (the one lifecycle of
``rustext.service``). All idempotent. The admin endpoint (balancer.admin) and the process around both
(balancer.runner) sit on top of this module.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
from collections.abc import Callable
from typing import Any

import rustext
from rustext.service import ServiceBase

from balancer import config as config_mod
from balancer.acme.renewal import Renewer
from balancer.acme.storage import Storage
from balancer.config import BackendConfig, BalancerConfig
from balancer.discovery import Discovery, DnsConfig, Target
from balancer.errors import BalancerConfigError
from balancer.health import HealthChecker
from balancer.ocsp import OcspStapler

log = logging.getLogger("balancer.service")


class LoadBalancer(ServiceBase):
    def __init__(self, config: BalancerConfig, *, config_path: str | os.PathLike[str] | None = None,
                 overrides: Callable[[BalancerConfig], BalancerConfig] | None = None,
                 drain_timeout: float = 30.0) -> None:
        """``overrides`` is applied to the file at each reload (the CLI's flags over the file);
        ``drain_timeout``: what :meth:`drain` gives requests in flight by default."""
        self.config = config
        self.drain_timeout = drain_timeout
        self.config_path = config_path
        self._overrides = overrides
        self._discovery: Discovery | None = None
        self._dns_task: asyncio.Task[None] | None = None
        self._renewer: Renewer | None = None
        if config.acme is not None:  # the HTTPS listener starts with what the folder has (a placeholder at first)
            Storage(config.acme.storage).ensure_placeholder(config.acme.names)
        self._native = rustext.Balancer(self._effective(config))
        self._health: dict[str, HealthChecker] = {}  # per backend pool with checks
        # TLS to backends as the data plane has it: a reload keeps it (see fixed_changes), and so do the checks
        self._backend_tls = config.tls if config.tls.backend else None
        self._reload_lock = asyncio.Lock()
        self._closed = asyncio.Event()
        self._started = False
        self._aborting: asyncio.Task[None] | None = None
        self._ocsp: OcspStapler | None = None

    # --- lifecycle -------------------------------------------------------
    async def start(self, inherited: dict[str, list[int]] | None = None) -> None:
        """Bind and serve; ``inherited``: listening sockets handed over by the
        process this one replaces (see balancer.handover), by listener key;
        the descriptors stay the caller's."""
        if self._started:
            raise RuntimeError("start() may be called once")
        self._started = True
        if self.config.dns_targets():
            await self._discover(self.config)
            self._native = rustext.Balancer(self._effective(self.config))
            self._dns_task = asyncio.create_task(self._follow_dns(), name="balancer dns")
        self._native.start(inherited)
        await self._sync_health(self._effective(self.config))
        if self.config.tls.certificates and self.config.tls.ocsp_stapling == "auto":
            self._ocsp = OcspStapler(lambda: self._native)
            self._ocsp.sync([c.cert for c in self.config.tls.certificates])
        if self.config.acme is not None:
            self._renewer = Renewer(self.config.acme, self._native, self._certificate_renewed)
            self._renewer.start()
        scheme = "https" if self._native.tls else "http"
        redirect = self._native.redirect_address
        extra = f", http://{redirect[0]}:{redirect[1]} redirects to https" if redirect else ""
        extra += ", TLS to backends" if self.config.tls.backend else ""
        pools = self.config.pools()
        def where(scheme: str, host: str, port: int) -> str:
            return host if host.startswith("unix:") else f"{scheme}://{host}:{port}"

        log.info(
            "balancer listening on %s (%d workers, %s%s) over %d backends%s",
            where(scheme, *self.address), self._native.workers, self.config.algorithm, extra,
            sum(len(p.backends) for p in pools.values()),
            f" in {len(pools)} pools" if self.config.named_backends else "",
        )
        for (host, port), listener in list(zip(self.addresses, self.config.effective_listeners()))[1:]:
            log.info("also listening on %s", where("https" if listener.tls else "http", host, port))
        if self.config.tls.certificates and not self.address[0].startswith("unix:"):
            from rustext.tls import trust_hint

            hint = trust_hint(self.config.tls.certificates[0].cert)
            if not hint.system:
                host, port = self.address
                ca = hint.ca_file or f"CA.pem (the certificate of {hint.issuer or 'the CA that issued it'})"
                log.info("clients verify it with the CA that issued its certificate: curl --cacert %s "
                         "https://%s:%d/", ca, host if ":" not in host else f"[{host}]", port)

    def listener_sockets(self) -> list[tuple[str, bool, list[int]]]:
        """Copies of every listener's sockets for a process taking them over:
        (key, tls, descriptors), the descriptors the caller's to close."""
        return self._native.listener_sockets()

    def handed_over(self) -> None:
        """Another process accepts on the listeners now: their Unix socket
        files stay when this one stops."""
        self._native.handed_over()

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
            proxied = {b.address: b.send_proxy or pool.send_proxy for b in pool.backends}
            tls = self._backend_tls
            if checker is not None and (checker.proto, checker.tls) != (pool.proto, tls):
                await self._health.pop(name).aclose()  # how backends are reached changed: start over
                for b in pool.backends:
                    self._native.set_backend_health(b.address, True, name)
                checker = None
            if checker is None:
                checker = self._health[name] = HealthChecker(
                    pool.health, functools.partial(self._mark_health, name), proto=pool.proto, tls=tls)
            checker.send_proxy = proxied
            # passive.on_error = "mark-down": the checker ends the data plane's ejections
            checker.ejected = (functools.partial(self._native.backend_ejected, pool=name)
                               if pool.passive.on_error == "mark-down" else None)
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

    async def drain(self, timeout: float | None = None) -> None:
        """Stop accepting, finish in-flight requests within `timeout` s (None:
        ``drain_timeout``), stop (see rustext.service). Idempotent."""
        await self._stop_control()
        await asyncio.to_thread(self._native.drain, self.drain_timeout if timeout is None else timeout)
        self._closed.set()

    def abort(self) -> None:
        """Stop now: a :meth:`drain` under way is cut short, in-flight
        exchanges end (the data plane's threads stop in the background)."""
        if self._renewer is not None:
            self._renewer.stop()
        self._aborting = asyncio.get_running_loop().create_task(asyncio.to_thread(self._native.close))

    async def _stop_control(self) -> None:
        if self._ocsp is not None:
            await self._ocsp.aclose()
        if self._renewer is not None:
            await self._renewer.aclose()
        if self._dns_task is not None:
            self._dns_task.cancel()
            try:
                await self._dns_task
            except asyncio.CancelledError:
                pass
            self._dns_task = None
        checkers, self._health = list(self._health.values()), {}
        for checker in checkers:
            await checker.aclose()

    # --- DNS discovery ---------------------------------------------------
    def _effective(self, config: BalancerConfig) -> BalancerConfig:
        """``config`` with each server given by name (in any pool) replaced by
        the servers of its addresses now (none before the first resolution);
        each keeps the settings of the server it comes from."""
        targets = config.dns_targets()
        if not targets:
            return config

        def expand(key: str, b: BackendConfig) -> list[BackendConfig] | None:
            target = targets.get(key)
            if target is None:
                return None
            addresses = self._discovery.addresses(target) if self._discovery is not None else []
            return [dataclasses.replace(b, address=address, srv=None, weight=b.weight if weight is None else weight)
                    for address, weight in addresses]

        return config.with_discovered(expand)

    async def _discover(self, config: BalancerConfig) -> None:
        """Follow ``config``'s names from now on; resolve the new ones (raises
        BalancerConfigError for one that fails when ``dns.init_addr = "error"``)."""
        targets = config.dns_targets()
        dns_config = config.dns or DnsConfig()
        if self._discovery is None:
            self._discovery = Discovery(dns_config)
        new = self._discovery.configure(dns_config, targets.values())
        if not new:
            return
        await self._discovery.refresh(new)
        unresolved = [t for t in new if not self._discovery.resolved(t)]
        if unresolved and dns_config.init_addr == "error":
            raise BalancerConfigError(
                f"backend {self._describe(unresolved[0])} does not resolve: "
                f"{self._discovery.stats()[unresolved[0].key]['last_error']} (dns.init_addr = \"error\")")
        for t in unresolved:
            log.warning("backend %s does not resolve yet: starting without it, trying every %g s",
                        self._describe(t), dns_config.interval)

    @staticmethod
    def _describe(target: Target) -> str:
        return target.name if target.kind == "srv" else target.key

    async def _follow_dns(self) -> None:
        """Resolve every name each ``dns.interval``; push a changed set of
        addresses through the reload path (no connection dropped)."""
        assert self._discovery is not None
        while True:
            await asyncio.sleep(self._discovery.config.interval)  # the period, not a synchronisation
            try:
                changed = await self._discovery.refresh()
            except Exception:  # a bug, not a DNS failure (those are recorded): keep following
                log.exception("dns: resolution round failed")
                continue
            if changed:
                async with self._reload_lock:
                    self._apply_backends()

    def _apply_backends(self) -> None:
        effective = self._effective(self.config)
        try:
            self._native.update(effective)
        except BalancerConfigError as exc:  # e.g. an address the data plane refuses: keep the running set
            log.error("dns: new addresses not applied: %s", exc)
            return
        for name, pool in effective.pools().items():
            checker = self._health.get(name)
            if checker is not None:
                checker.set_backends(b.address for b in pool.backends)

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
        if self._ocsp is not None:  # a renewed certificate needs its own status
            self._ocsp.sync([c.cert for c in self.config.tls.certificates])

    async def reload(self, new: BalancerConfig | None = None) -> None:
        """Apply ``new`` (or re-read the config file) without dropping connections."""
        async with self._reload_lock:
            if new is None:
                if self.config_path is None:
                    if self.config.access_log is not None:  # logrotate moved the file
                        self._native.reopen_access_log()
                    if self._native.tls:  # configured by flags: the certificates are what can change
                        self._reload_tls()
                        return
                    if self.config.access_log is not None:
                        return
                    raise BalancerConfigError("no configuration file to reload")
                new = await asyncio.to_thread(config_mod.load, self.config_path)
                if self._overrides is not None:
                    new = self._overrides(new)
            if self._native.tls:
                self._reload_tls()
            fixed = self.config.fixed_changes(new)
            if fixed:
                log.warning("reload: %s need a restart; kept as they were", ", ".join(fixed))
            snapshot = self._discovery.snapshot() if self._discovery is not None else None
            try:
                if new.dns_targets():
                    await self._discover(new)  # raises for an unresolvable name when dns.init_addr = "error"
                elif self._discovery is not None:
                    self._discovery.configure(self._discovery.config, ())
                effective = self._effective(new)
                self._native.update(effective)  # raises and keeps the old config on error
            except BaseException:
                if self._discovery is not None:
                    if snapshot is None:
                        self._discovery = None
                    else:
                        self._discovery.restore(snapshot)
                raise
            self.config = new
            if new.dns_targets() and self._dns_task is None:
                self._dns_task = asyncio.create_task(self._follow_dns(), name="balancer dns")
            await self._sync_health(effective)
            pools = effective.pools()
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
    @property
    def acme(self) -> Renewer | None:
        """The ACME renewal of this process (None without ``[acme]``): orders, failures, next attempt."""
        return self._renewer

    def _certificate_renewed(self) -> None:
        """ACME wrote a new certificate: serve it, and staple its own OCSP status."""
        self._native.reload_tls()
        if self._ocsp is not None and self.config.tls is not None:
            self._ocsp.sync([c.cert for c in self.config.tls.certificates])

    def stats(self) -> dict[str, Any]:
        """The data plane's statistics, and ``dns``: per backend name,
        resolutions, failures, addresses in use and the last error;
        ``ocsp``: per certificate file, its stapling (balancer.ocsp)."""
        out = self._native.stats()
        out["dns"] = self._discovery.stats() if self._discovery is not None else {}
        out["ocsp"] = self._ocsp.stats() if self._ocsp is not None else {}
        return out

    def backends(self) -> list[dict[str, Any]]:
        out = self._native.backends()
        sources = {}
        if self._discovery is not None:
            for t in self._discovery.targets:
                for address, _ in self._discovery.addresses(t):
                    sources.setdefault(address, t.key)
        for b in out:
            checker = self._health.get(b["pool"])
            b["healthy"] = checker.healthy.get(b["name"], True) if checker is not None else True
            if b["name"] in sources:
                b["source"] = sources[b["name"]]
        return out
