"""Session-wide fixtures: real servers on free loopback ports.

``redis_server`` starts one real ``redis-server`` (no persistence) per test
session and yields its URL; ``redis_url`` flushes it before each test.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from tests.netutil import RedisServer, free_port, start_redis, wait_for_port

__all__ = ["RedisServer", "free_port", "start_redis", "wait_for_port"]


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = start_redis()
    yield server
    server.stop()
    shutil.rmtree(server.dir, ignore_errors=True)


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """URL of the session's redis-server, flushed for this test."""
    import redis

    client = redis.Redis(host="127.0.0.1", port=redis_server.port)
    try:
        client.flushall()
    finally:
        client.close()
    return redis_server.url


SHARED = os.environ.get(
    "JUGGLER_SHARED_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "shared")
)


@pytest.fixture(scope="session")
def shared_dir() -> str:
    """The project's ../shared folder (protocols and vectors)."""
    path = os.path.abspath(SHARED)
    if not os.path.isdir(os.path.join(path, "vectors")):
        pytest.fail(f"shared vectors not found at {path} (set JUGGLER_SHARED_DIR)")
    return path
