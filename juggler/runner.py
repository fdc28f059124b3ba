"""A juggler server process: broker + server (+ callees) + metrics (+ the server API).

Shared by ``juggler server`` and ``juggler up`` (cli/), which run it with
``cli.lifecycle.serve``: :func:`start_app` starts everything or, on failure,
closes what it started and raises; :meth:`Running.drain` stops accepting,
lets calls in flight finish, closes connections (1001) within
``close_timeout``, drains the callees, then closes the brokers;
:meth:`Running.abort` does it at once.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass
from typing import Any

from prometheus_client.registry import CollectorRegistry

from rustext.service import ServiceBase

from juggler.broker.memory import MemoryBroker
from juggler.config import AppConfig
from juggler.metrics import (
    MetricsServer,
    ServerStats,
    StatsCollector,
    broker_source,
    callee_source,
    serve_metrics,
    server_gauges,
)
from juggler.server import Server
from juggler.static_files import StaticSite, stats_snapshot

__all__ = ["Running", "start_app"]

log = logging.getLogger("juggler.server")


@dataclass
class Running(ServiceBase):
    """What :func:`start_app` started: ``drain()`` stops it all in order,
    ``abort()`` at once (a second Ctrl-C)."""

    server: Server
    broker: Any
    callee: Any = None
    metrics: MetricsServer | None = None
    pubsub: Any = None  # a separate pub-sub broker, if any
    auth: Any = None  # juggler.auth.Auth (its JWKS refresh), if any
    control: Any = None  # juggler.control.Control: the server API's commands between servers
    api: Any = None  # juggler.api.ApiServer, if served
    presence: Any = None  # juggler.presence.Presence, when channels keep presence
    proxies: Any = None  # juggler.proxy.ProxySet, when [[proxy]] tables are configured

    def draining(self) -> str:
        """What a drain waits for, in words (empty: nothing in flight)."""
        n = self.server.calls_in_flight()
        if not n:
            return ""
        return f"draining {n} call{'s' if n != 1 else ''} for up to {self.server.config.drain_timeout:g} s"

    _aborted = False

    async def start(self) -> None:
        """Started by :func:`start_app` already (see rustext.service)."""

    async def drain(self, timeout: float | None = None) -> None:
        """Stop accepting, let calls in flight finish (`timeout` s, None:
        ``drain_timeout``), close connections, stop the callees, close the
        brokers. Idempotent."""
        if self.api is not None:
            await self.api.aclose()
        await self.server.drain(timeout)
        if self.presence is not None:
            await self.presence.aclose()
        if self.proxies is not None:
            await self.proxies.aclose()
        if self.control is not None:
            await self.control.aclose()
        if self.auth is not None:
            await self.auth.aclose()
        if self.callee is not None:
            await self.callee.drain(0.0 if self._aborted else 5.0)
        await self.broker.aclose()
        if self.pubsub is not None:
            await self.pubsub.aclose()
        if self.metrics is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.metrics.close)
            self.metrics = None

    def abort(self) -> None:
        """Stop now: a drain in progress ends at once, connections are
        dropped, running callee calls cancelled."""
        self._aborted = True
        if self.api is not None:
            self.api.abort()
        self.server.abort()
        if self.callee is not None:
            self.callee.abort()

    def reload_tls(self) -> None:
        """SIGHUP: read the certificate files again (logged; the current ones
        stay in service when the new ones are unusable)."""
        from rustext.tls import TlsConfigError

        try:
            if self.server.reload_tls():
                log.info("TLS certificate reloaded from %s", self.server.config.tls_cert)
        except TlsConfigError as exc:
            log.error("TLS certificate not reloaded: %s", exc)


async def start_app(config: AppConfig, *, test_callees: bool = False, callee_workers: int = 200,
                    demo: bool = False, traced: bool = False) -> Running:
    """Start broker, server, optional in-process test callees and metrics;
    on any failure (or cancellation) close what was started, then raise.
    ``traced``: a span per CALL and per test-callee call (``juggler.tracing``,
    through the process's global tracer provider).

    The server also answers plain HTTP on its port: ``/juggler.js`` (the
    browser client) always; the demo page at ``/`` and ``/stats.json`` when
    ``demo`` (``juggler up``).
    """
    if config.api is not None:
        config.api.check_key()  # before anything is started
    started: list[Any] = []  # what to close if a later step fails, last first
    try:
        if config.redis is not None:
            from juggler.broker.redis import RedisBroker

            broker: Any = RedisBroker(config.redis)
        else:
            broker = MemoryBroker(config.memory)
        started.append(broker)
        await broker.start()
        pubsub: Any = None
        if config.pubsub is not None:
            from juggler.broker.redis import RedisBroker

            pubsub = RedisBroker(config.pubsub)
            started.append(pubsub)
            await pubsub.start()
        auth = None
        if config.auth is not None and config.auth.active:
            from juggler.auth import Auth

            auth = Auth(config.auth)
            started.append(auth)
            await auth.start()
        callee = None
        if test_callees:  # before the server: no call may come before its callee is there
            from juggler.callee import Callee, make_test_app

            callee_tracing = None
            if traced:
                from juggler.tracing import CalleeTracing

                callee_tracing = CalleeTracing()
            callee = Callee(broker, make_test_app(), workers=callee_workers, tracing=callee_tracing)
            started.append(callee)
            await callee.start()
            if isinstance(broker, MemoryBroker):
                await broker.until_served(callee.uris)
        presence = None
        if any(rule.presence for rule in config.channels.rules):
            from juggler.presence import Presence

            presence = Presence(pubsub if pubsub is not None else broker, config.channels)
            started.append(presence)
            await presence.start()
        proxies = None
        if config.proxy:
            from juggler.proxy import ProxySet

            proxies = ProxySet(config.proxy)
            started.append(proxies)
            await proxies.start()
        stats = ServerStats()
        middleware: list[Any] = []
        if traced:
            from juggler.tracing import CallTracing

            middleware.append(CallTracing())
        server = Server(broker, config.server, stats=stats, pubsub=pubsub, auth=auth, channels=config.channels,
                        presence=presence, middleware=middleware, proxies=proxies)
        server.http = StaticSite(demo=demo, stats=functools.partial(stats_snapshot, server))
        from juggler.refreshing import TokenRefresh

        refresher = None
        if proxies is not None and proxies.pick("refresh") is not None:
            from juggler.proxy.refresher import ProxyRefresher

            refresher = ProxyRefresher(proxies)  # the application renews expiring connections
        # REFRESH, SUB_REFRESH, tokens (and the connect proxy's expiries) timed
        TokenRefresh(auth, config.channels, refresher=refresher,
                     proxied=proxies is not None and proxies.pick("connect") is not None).install(server)
        started.append(server)
        await server.start()
        control, api = await _start_api(config, server, started)
        metrics = None
        if config.metrics.port:
            registry = CollectorRegistry(auto_describe=True)
            sources = [broker_source(broker)]
            if pubsub is not None:
                sources.append(broker_source(pubsub))
            if callee is not None:
                sources.append(callee_source(callee))
            registry.register(StatsCollector(stats, *sources, gauges=server_gauges(server)))
            if proxies is not None:
                from juggler.proxy import ProxyCollector

                registry.register(ProxyCollector(proxies.stats))
            metrics = serve_metrics(registry, config.metrics.port, config.metrics.host)
    except BaseException:
        for part in reversed(started):
            try:
                await part.aclose()
            except Exception:  # a part that failed to start may fail to close too
                log.debug("closing %r after a failed start", part, exc_info=True)
        raise
    return Running(server=server, broker=broker, callee=callee, metrics=metrics, pubsub=pubsub, auth=auth,
                   control=control, api=api, presence=presence, proxies=proxies)


async def _start_api(config: AppConfig, server: Server, started: list[Any]) -> tuple[Any, Any]:
    """The control plane (always with Redis: the server API of any server
    sharing it reaches this one's connections) and the server API, if
    configured. Without the API, a control plane that cannot start (Redis
    older than 7) is logged and done without."""
    from juggler.broker.base import BrokerError
    from juggler.control import Control, package_version

    control = None
    if config.api is not None or config.redis is not None:
        control = Control.for_server(server, version=package_version())
        started.append(control)
        try:
            await control.start()
        except BrokerError as exc:
            if config.api is not None:
                raise
            log.warning("server API commands will not reach this server: %s", exc)
            started.remove(control)
            await control.aclose()
            control = None
    api = None
    if config.api is not None:
        from juggler.api import ApiServer

        api = ApiServer(server, config.api, control=control)
        started.append(api)
        await api.start()
    return control, api


class CalleeProcess(ServiceBase):
    """A callee process (``juggler callee``): its broker, the callee, its
    metrics endpoint; a :class:`rustext.service.Service` built by
    :func:`start_callee`."""

    def __init__(self, callee: Any, broker: Any, metrics: Any) -> None:
        self.callee, self.broker, self.metrics = callee, broker, metrics

    def draining(self) -> str:
        """What a drain waits for, in words (empty: nothing running)."""
        n = self.callee.stats.running
        if not n:
            return ""
        return f"draining {n} running call{'s' if n != 1 else ''} for up to {self.callee.drain_timeout:g} s"

    async def start(self) -> None:
        """Started by :func:`start_callee` already."""

    async def drain(self, timeout: float | None = None) -> None:
        """Stop taking calls, let running ones finish (`timeout` s, None: the
        callee's ``drain_timeout``), close the broker and the metrics endpoint."""
        await self.callee.drain(timeout)
        await self.broker.aclose()
        if self.metrics is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.metrics.close)
            self.metrics = None
        s = self.callee.stats
        logging.getLogger("juggler.callee").info(
            "stopped: %d calls, %d results, %d errors, %d expired", s.calls, s.results, s.errors, s.expired
        )

    def abort(self) -> None:
        self.callee.abort()


async def start_callee(config: Any, app: Any, *, workers: int = 50, drain_timeout: float = 10.0,
                       metrics_port: int | None = None, traced: bool = False) -> CalleeProcess:
    """Connect to Redis (``config``: a RedisBrokerConfig), serve `app` with
    `workers` slots, and Prometheus metrics on 127.0.0.1:`metrics_port`.
    Raises BrokerError (Redis unreachable) or ListenError (a busy port)."""
    from juggler.broker.redis import RedisBroker
    from juggler.callee import Callee

    broker = RedisBroker(config)
    try:
        await broker.start()
    except BaseException:
        await broker.aclose()
        raise
    tracing = None
    if traced:
        from juggler.tracing import CalleeTracing

        tracing = CalleeTracing()
    callee = Callee(broker, app, workers=workers, tracing=tracing, drain_timeout=drain_timeout)
    metrics = None
    try:
        if metrics_port:
            metrics = _serve_callee_metrics(callee, broker, metrics_port)
        await callee.start()
    except BaseException:
        if metrics is not None:
            metrics.close()
        await broker.aclose()
        raise
    return CalleeProcess(callee, broker, metrics)


def _serve_callee_metrics(callee: Any, broker: Any, port: int) -> Any:
    """Prometheus metrics of one callee process, read from its counters at scrape time."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.registry import Collector, CollectorRegistry

    from juggler.metrics import serve_metrics

    class CalleeCollector(Collector):
        def collect(self):  # type: ignore[no-untyped-def]
            s = callee.stats
            b = broker.stats
            yield CounterMetricFamily("juggler_callee_calls", "Calls taken from the broker", value=s.calls)
            yield CounterMetricFamily("juggler_callee_results", "Results stored", value=s.results)
            yield CounterMetricFamily("juggler_callee_errors", "Results that are errors", value=s.errors)
            yield CounterMetricFamily(
                "juggler_callee_expired", "Calls skipped or results dropped because the TTL ran out",
                value=s.expired + b.expired_calls,
            )
            yield CounterMetricFamily("juggler_callee_store_failures", "Results the broker failed to store",
                                      value=s.store_failures)
            yield GaugeMetricFamily("juggler_callee_running", "Calls running now", value=s.running)

    registry = CollectorRegistry()
    registry.register(CalleeCollector())
    return serve_metrics(registry, port)  # raises rustext.net.ListenError on a busy port
