"""The registries over TLS: etcd on HTTPS (with client certificates) and a
Redis registry on ``rediss://``, real servers started with certificates of
the test CA; a registry whose certificate the client cannot verify is
unavailable with a message naming the cause."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from rpc.discovery.etcd import EtcdDiscovery, EtcdRegistrar
from rpc.discovery.redis import RedisDiscovery, RedisRegistrar
from rpc.errors import RegistryUnavailable
from rustext.tls import ClientTls
from tests.netutil import free_port, redis_tls_args, start_redis
from tests.rpc.conftest import start_etcd
from tests.rpc.discovery.helpers import wait_servers
from tests.tlsutil import TestPKI

pytestmark = [pytest.mark.timeout(120)]

A = "tcp@127.0.0.1:7001"


@pytest.fixture
def tls_etcd(pki: TestPKI) -> Iterator[Any]:
    server = start_etcd(tls=pki.leaf(), ca=str(pki.ca))
    yield server
    server.stop(timeout=10)
    shutil.rmtree(server.dir, ignore_errors=True)


async def test_etcd_registry_over_https_with_a_client_certificate(tls_etcd: Any, pki: TestPKI, tmp_path: Any) -> None:
    client = pki.leaf("rpc-client")
    tls = ClientTls(ca=str(pki.ca), cert=str(client.cert), key=str(client.key))
    reg = EtcdRegistrar(tls_etcd.endpoint, base="/tls", ttl=10, tls=tls)
    disc = EtcdDiscovery(tls_etcd.endpoint, "Arith", base="/tls", refresh_interval=60, tls=tls)
    await disc.start()
    try:
        await reg.register("Arith", A, "weight=2")
        assert await wait_servers(disc, lambda s: A in s) == {A: "weight=2"}
    finally:
        await disc.aclose()
        await reg.aclose()
    # a client that does not trust the server's CA
    other = TestPKI(tmp_path / "other")
    stranger = EtcdRegistrar(tls_etcd.endpoint, base="/tls", ttl=10, tls=ClientTls(ca=str(other.ca)))
    with pytest.raises(RegistryUnavailable, match="server certificate refused"):
        await stranger.register("Arith", A)
    await stranger.aclose()
    with pytest.raises(ValueError, match="https://"):
        EtcdRegistrar(tls_etcd.endpoint.replace("https", "http"), tls=tls)


async def test_redis_registry_over_rediss(pki: TestPKI) -> None:
    port = free_port()
    server = start_redis(["--port", "0", "--tls-port", str(port),
                          *redis_tls_args(pki.leaf(), str(pki.ca), auth_clients=True)], port=port)
    client = pki.leaf("rpc-client")
    tls = ClientTls(ca=str(pki.ca), cert=str(client.cert), key=str(client.key))
    url = f"rediss://127.0.0.1:{port}/0"
    reg = RedisRegistrar(url, base="/tls", ttl=10, tls=tls)
    disc = RedisDiscovery(url, "Arith", base="/tls", refresh_interval=0.2, tls=tls)
    try:
        await disc.start()
        await reg.register("Arith", A, "weight=3")
        assert await wait_servers(disc, lambda s: A in s) == {A: "weight=3"}
        with pytest.raises(ValueError, match="rediss://"):
            RedisRegistrar(f"redis://127.0.0.1:{port}/0", tls=tls)
    finally:
        await disc.aclose()
        await reg.aclose()
        server.stop()
        shutil.rmtree(server.dir, ignore_errors=True)
