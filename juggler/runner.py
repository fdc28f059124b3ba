"""Run a juggler server process: broker + server (+ callees) + metrics, until a signal.

Shared by ``juggler server`` and ``juggler up`` (cli/). One start-up log line
says where it listens; SIGINT/SIGTERM stop accepting, close connections
(1001) within ``close_timeout``, drain the callees, then close the broker.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
from dataclasses import dataclass
from typing import Any

from prometheus_client.registry import CollectorRegistry

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

__all__ = ["Running", "run_app", "start_app"]

log = logging.getLogger("juggler.server")


@dataclass
class Running:
    """What :func:`start_app` started; ``aclose()`` stops it all in order."""

    server: Server
    broker: Any
    callee: Any = None
    metrics: MetricsServer | None = None
    pubsub: Any = None  # a separate pub-sub broker, if any
    auth: Any = None  # juggler.auth.Auth (its JWKS refresh), if any

    async def aclose(self) -> None:
        await self.server.aclose()
        if self.auth is not None:
            await self.auth.aclose()
        if self.callee is not None:
            await self.callee.drain(timeout=5.0)
            await self.callee.aclose()
        await self.broker.aclose()
        if self.pubsub is not None:
            await self.pubsub.aclose()
        if self.metrics is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.metrics.close)


async def start_app(config: AppConfig, *, test_callees: bool = False, callee_workers: int = 200,
                    demo: bool = False) -> Running:
    """Start broker, server, optional in-process test callees and metrics.

    The server also answers plain HTTP on its port: ``/juggler.js`` (the
    browser client) always; the demo page at ``/`` and ``/stats.json`` when
    ``demo`` (``juggler up``).
    """
    if config.redis is not None:
        from juggler.broker.redis import RedisBroker

        broker: Any = RedisBroker(config.redis)
    else:
        broker = MemoryBroker(config.memory)
    await broker.start()
    pubsub: Any = None
    if config.pubsub is not None:
        from juggler.broker.redis import RedisBroker

        pubsub = RedisBroker(config.pubsub)
        try:
            await pubsub.start()
        except BaseException:
            await broker.aclose()
            await pubsub.aclose()
            raise
    auth = None
    if config.auth is not None and config.auth.active:
        from juggler.auth import Auth

        auth = Auth(config.auth)
        await auth.start()
    callee = None
    metrics = None
    stats = ServerStats()
    server = Server(broker, config.server, stats=stats, pubsub=pubsub, auth=auth)
    server.http = StaticSite(demo=demo, stats=functools.partial(stats_snapshot, server))
    try:
        await server.start()
        if test_callees:
            from juggler.callee import Callee, make_test_app

            callee = Callee(broker, make_test_app(), workers=callee_workers)
            await callee.start()
        if config.metrics.port:
            registry = CollectorRegistry(auto_describe=True)
            sources = [broker_source(broker)]
            if pubsub is not None:
                sources.append(broker_source(pubsub))
            if callee is not None:
                sources.append(callee_source(callee))
            registry.register(StatsCollector(stats, *sources, gauges=server_gauges(server)))
            metrics = serve_metrics(registry, config.metrics.port, config.metrics.host)
    except BaseException:
        await server.aclose()
        if auth is not None:
            await auth.aclose()
        if callee is not None:
            await callee.aclose()
        await broker.aclose()
        if pubsub is not None:
            await pubsub.aclose()
        raise
    return Running(server=server, broker=broker, callee=callee, metrics=metrics, pubsub=pubsub, auth=auth)


async def run_app(config: AppConfig, *, test_callees: bool = False, callee_workers: int = 200,
                  banner: str | None = None, demo: bool = False) -> int:
    """Run until SIGINT/SIGTERM; returns the exit code."""
    if not logging.getLogger("juggler.conn.ws").level:
        logging.getLogger("juggler.conn.ws").setLevel(logging.WARNING)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        running = await start_app(config, test_callees=test_callees, callee_workers=callee_workers, demo=demo)
    except OSError as exc:
        log.error("cannot start: %s", exc)
        return 1
    broker_desc = f"redis {running.broker.description}" if config.redis is not None else "in-memory broker"
    if running.pubsub is not None:
        broker_desc += f", pub-sub on redis {running.pubsub.description}"
    extra = f", metrics on http://{config.metrics.host}:{running.metrics.port}/metrics" if running.metrics else ""
    callees = ", test callees test.echo/test.reverse/test.delay" if test_callees else ""
    log.info("juggler server listening on %s (%s%s%s)", running.server.url, broker_desc, callees, extra)
    page = running.server.url.replace("ws://", "http://", 1).removesuffix(config.server.path) + "/"
    if demo:
        log.info("demo page on %s (browser client %sjuggler.js)", page, page)
    if banner:
        print(banner.format(url=running.server.url, page=page), flush=True)
    try:
        await stop.wait()
    finally:
        log.info("shutting down")
        await running.aclose()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    return 0
