"""Fixtures of the juggler tests: a real Redis Cluster (3 masters + 3 replicas)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from rediscluster import RedisCluster


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster]:
    """A Redis Cluster of six redis-server processes on loopback (session-wide).

    Tests that kill a node restart it afterwards and wait for the cluster to be
    ok again, so later tests get three masters serving every slot."""
    cluster = RedisCluster.create()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def cluster_seeds(redis_cluster: RedisCluster) -> str:
    """Seed URLs of the session's cluster (comma-separated), flushed for this test."""
    redis_cluster.wait_ok()
    redis_cluster.flushall()
    return redis_cluster.seeds
