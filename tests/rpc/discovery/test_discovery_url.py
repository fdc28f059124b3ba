"""rpc.discovery.url: registry URLs parsed without any I/O; a route's names checked."""

from __future__ import annotations

import pytest

from rpc.discovery.url import RegistryRoute, RegistryURL, is_registry_url


@pytest.mark.parametrize(
    ("url", "kind", "endpoint", "base", "display"),
    [
        ("etcd://127.0.0.1:2379/rpcx", "etcd", "http://127.0.0.1:2379", "/rpcx", "etcd://127.0.0.1:2379"),
        ("etcd://10.0.0.2", "etcd", "http://10.0.0.2:2379", "/rpcx", "etcd://10.0.0.2:2379"),
        ("etcds://etcd.internal:2379/a/b", "etcd", "https://etcd.internal:2379", "/a/b", "etcds://etcd.internal:2379"),
        ("redis://127.0.0.1:6379/rpcx", "redis", "redis://127.0.0.1:6379/0", "/rpcx", "redis://127.0.0.1:6379"),
        ("redis://u:p%40w@h/svc?db=3", "redis", "redis://u:p%40w@h:6379/3", "/svc", "redis://h:6379"),
        ("rediss://[::1]:7000/", "redis", "rediss://[::1]:7000/0", "/", "rediss://[::1]:7000"),
    ],
)
def test_parse(url: str, kind: str, endpoint: str, base: str, display: str) -> None:
    r = RegistryURL.parse(url)
    assert (r.kind, r.endpoint, r.base, r.display) == (kind, endpoint, base, display)
    assert is_registry_url(url)


@pytest.mark.parametrize("target", ["127.0.0.1:8972", "tcp@h:1", "http://h:1", "inproc:bench", "unix@/tmp/s"])
def test_addresses_are_not_registries(target: str) -> None:
    assert not is_registry_url(target)


@pytest.mark.parametrize(
    ("url", "error"),
    [
        ("http://127.0.0.1:2379/rpcx", "not a registry URL"),
        ("etcd:///rpcx", "no host"),
        ("redis://h:99999/rpcx", "bad port"),
        ("redis://h/rpcx?db=1&x=2", "unknown query parameter 'x'"),
        ("etcd://u:p@h/rpcx", "user and password are not supported"),
        ("etcd://h/rpcx#x", "fragment"),
    ],
)
def test_bad_urls(url: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        RegistryURL.parse(url)


def test_tls_needs_a_tls_scheme() -> None:
    from rustext.tls import ClientTls

    with pytest.raises(ValueError, match="etcds:// or rediss://"):
        RegistryURL.parse("redis://h/rpcx", tls=ClientTls())
    assert RegistryURL.parse("rediss://h/rpcx", tls=ClientTls()).tls is not None


def test_route_checks_its_names() -> None:
    url = RegistryURL.parse("etcd://h/rpcx")
    with pytest.raises(ValueError, match="unknown selector"):
        RegistryRoute(registry=url, selector="fastest")
    with pytest.raises(ValueError, match="unknown fail mode"):
        RegistryRoute(registry=url, fail_mode="failslow")
    with pytest.raises(ValueError, match="retries"):
        RegistryRoute(registry=url, retries=-1)


def test_redis_key_layout_from_the_query() -> None:
    assert RegistryURL.parse("redis://h/rpcx").layout == "libkv"  # Go rpcx's
    old = RegistryURL.parse("redis://h/rpcx?layout=juggler&db=2")
    assert (old.layout, old.endpoint, old.base) == ("juggler", "redis://h:6379/2", "/rpcx")
    assert old.discovery("Arith").layout == "juggler"  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="layout must be libkv or juggler, got 'etcd'"):
        RegistryURL.parse("redis://h/rpcx?layout=etcd")
