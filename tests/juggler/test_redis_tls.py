"""juggler over Redis with TLS (``rediss://``): a single Redis requiring
client certificates, and a Redis Cluster spoken to over TLS only (client
port, cluster bus and replication). Real redis-server processes."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from rediscluster import RedisCluster
from stacks import redis_stack

from juggler.broker.redis import RedisBroker, RedisBrokerConfig
from juggler.broker.resp import RedisConnectionError
from juggler.client import connect
from tests.netutil import RedisServer, free_port, redis_tls_args, start_redis
from tests.tlsutil import TestPKI

pytestmark = [pytest.mark.timeout(120)]


@pytest.fixture
def tls_redis(pki: TestPKI) -> Iterator[tuple[RedisServer, TestPKI]]:
    """A redis-server on TLS only that requires a client certificate."""
    port = free_port()
    server = start_redis(["--port", "0", "--tls-port", str(port), *redis_tls_args(pki.leaf(), str(pki.ca), auth_clients=True)],
                         port=port)
    yield server, pki
    server.stop()
    shutil.rmtree(server.dir, ignore_errors=True)


async def test_calls_and_events_through_a_redis_that_requires_client_certificates(
    tls_redis: tuple[RedisServer, TestPKI],
) -> None:
    server, pki = tls_redis
    client = pki.leaf("juggler-client")
    tls = dict(tls_ca=str(pki.ca), tls_cert=str(client.cert), tls_key=str(client.key))
    async with redis_stack(url=f"rediss://127.0.0.1:{server.port}/0", **tls) as srv:
        async with connect(srv.url) as c, connect(srv.url) as d:
            assert await c.call("test.echo", "over tls", timeout=10) == "over tls"
            await d.sub("news")
            await c.pub("news", {"x": 1})
            assert (await d.next_event(timeout=5)).args == {"x": 1}


@pytest.mark.parametrize("case", ["no client certificate", "wrong CA", "plain redis:// URL"])
async def test_refusals_are_reported_at_start(tls_redis: tuple[RedisServer, TestPKI], tmp_path: Path, case: str) -> None:
    server, pki = tls_redis
    client = pki.leaf("juggler-client")
    url = f"rediss://127.0.0.1:{server.port}/0"
    kw: dict[str, object] = dict(tls_ca=str(pki.ca), tls_cert=str(client.cert), tls_key=str(client.key))
    if case == "no client certificate":
        kw = dict(tls_ca=str(pki.ca))
    elif case == "wrong CA":
        kw["tls_ca"] = str(TestPKI(tmp_path / "other").ca)
    else:
        url = f"redis://127.0.0.1:{server.port}/0"
        kw = {}
    broker = RedisBroker(RedisBrokerConfig(url=url, connect_timeout=2.0, command_timeout=2.0, **kw))
    try:
        with pytest.raises(RedisConnectionError) as info:
            await broker.start()
        if case == "wrong CA":
            assert "certificate" in str(info.value) and "--tls-ca" in str(info.value)
    finally:
        await broker.aclose()


def test_tls_options_need_a_rediss_url_and_readable_files(pki: TestPKI, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="rediss://"):
        RedisBrokerConfig(url="redis://127.0.0.1:6379/0", tls_ca=str(pki.ca))
    with pytest.raises(ValueError, match="nope.pem"):
        RedisBrokerConfig(url="rediss://127.0.0.1:6379/0", tls_ca=str(tmp_path / "nope.pem"))
    with pytest.raises(ValueError, match="both"):
        RedisBrokerConfig(url="rediss://127.0.0.1:6379/0", tls_cert=str(pki.ca))


@pytest.mark.slow
async def test_a_redis_cluster_over_tls(pki: TestPKI) -> None:
    cluster = RedisCluster.create(tls=(pki.leaf(), str(pki.ca)))
    try:
        assert cluster.seeds.startswith("rediss://")
        async with redis_stack(cluster=cluster.seeds, tls_ca=str(pki.ca)) as srv:
            async with connect(srv.url) as c, connect(srv.url) as d:
                results = [await c.call("test.echo", str(i), timeout=10) for i in range(20)]
                assert results == [str(i) for i in range(20)]
                await d.sub("tls.*", pattern=True)
                await c.pub("tls.a", 1)
                assert (await d.next_event(timeout=5)).channel == "tls.a"
    finally:
        cluster.stop()
