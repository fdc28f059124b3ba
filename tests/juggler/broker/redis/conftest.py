"""Fixtures of the Redis broker tests: a redis-py client and a started broker
on the session's redis-server (``redis_url``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aredis

from juggler.broker.redis import RedisBroker, RedisBrokerConfig


@pytest.fixture
async def r(redis_url: str) -> AsyncIterator[aredis.Redis]:
    client = aredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
async def broker(redis_url: str) -> AsyncIterator[RedisBroker]:
    b = RedisBroker(RedisBrokerConfig(url=redis_url, block_timeout=0.5))
    await b.start()
    yield b
    await b.aclose()
