"""In-process juggler stacks on a Redis broker: a server and test callees,
each with its own broker (as separate processes would have), for tests that
need the whole path through a real Redis or Redis Cluster."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from juggler.broker.redis import RedisBroker, RedisBrokerConfig
from juggler.callee import Callee, make_test_app
from juggler.config import ServerConfig
from juggler.server import Server

#: test.echo, test.reverse, test.delay, test.delay.0..3
URIS = make_test_app(4).uris


@contextlib.asynccontextmanager
async def redis_stack(*, pubsub_url: str | None = None, callee_kw: dict[str, Any] | None = None,
                      server_kw: dict[str, Any] | None = None, workers: int = 50,
                      **broker_kw: Any) -> AsyncIterator[Server]:
    """A started server on port 0 and `workers` test callees; ``broker_kw``
    are RedisBrokerConfig options (``url=`` or ``cluster=``, TLS, …), which
    ``callee_kw`` overrides for the callees' broker (another URL: a fault
    proxy); ``server_kw`` are ServerConfig options; ``pubsub_url`` puts
    pub-sub on a Redis of its own."""
    broker = RedisBroker(RedisBrokerConfig(**broker_kw))
    await broker.start()
    pubsub = None
    if pubsub_url is not None:
        pubsub = RedisBroker(RedisBrokerConfig(url=pubsub_url))
        await pubsub.start()
    callee_broker = RedisBroker(RedisBrokerConfig(**{**broker_kw, **(callee_kw or {})}))
    await callee_broker.start()
    server = Server(broker, ServerConfig(**{"port": 0, **(server_kw or {})}), pubsub=pubsub)
    callee = Callee(callee_broker, make_test_app(4), workers=workers)
    try:
        await server.start()
        await callee.start()
        yield server
    finally:
        await server.aclose()
        await callee.drain(timeout=5)
        await callee.aclose()
        await callee_broker.aclose()
        await broker.aclose()
        if pubsub is not None:
            await pubsub.aclose()
