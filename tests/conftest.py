"""Session-wide fixtures: real servers on free loopback ports.

``redis_server`` starts one real ``redis-server`` (no persistence) per test
session and yields its URL; ``redis_url`` flushes it before each test.
"""

from __future__ import annotations

import os
import subprocess
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


CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _shared_candidates() -> list[str]:
    """Where ../shared may be: $JUGGLER_SHARED_DIR, beside this checkout, or beside
    the checkout this one was cloned from (a clone made elsewhere, e.g. in /tmp)."""
    if "JUGGLER_SHARED_DIR" in os.environ:
        return [os.environ["JUGGLER_SHARED_DIR"]]
    found = [os.path.join(CHECKOUT, "..", "shared")]
    try:
        origin = subprocess.run(["git", "-C", CHECKOUT, "config", "--get", "remote.origin.url"],
                                capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        origin = ""
    if origin.startswith("file://"):
        origin = origin[len("file://"):]
    if origin and os.path.isdir(origin):
        found.append(os.path.join(origin, "..", "shared"))
    return found


@pytest.fixture(scope="session")
def shared_dir() -> str:
    """The project's ../shared folder (protocols and vectors)."""
    tried = [os.path.abspath(p) for p in _shared_candidates()]
    for path in tried:
        if os.path.isdir(os.path.join(path, "vectors")):
            return path
    pytest.fail(f"shared vectors not found at {' or '.join(tried)} (set JUGGLER_SHARED_DIR)")


@pytest.fixture
def pki(tmp_path_factory: pytest.TempPathFactory) -> "TestPKI":
    """A fresh test CA (root + intermediate) issuing certificates as PEM files
    (tests/tlsutil.py)."""
    from tests.tlsutil import TestPKI

    return TestPKI(tmp_path_factory.mktemp("pki"))
