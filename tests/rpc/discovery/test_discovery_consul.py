"""rpc.discovery.consul without a server: consul:// URLs, the checks that
keep a registrar within what Consul accepts, and the keys derived from a
base path as libkv derives them. (Against a real Consul and Go rpcx:
tests/rpc/test_consul_registry_interop.py.)"""

from __future__ import annotations

import pytest

from rpc.discovery.consul import (
    ConsulDiscovery,
    ConsulHTTP,
    ConsulRegistrar,
    _go_duration,
    _reencode,
)
from rpc.discovery.url import RegistryURL, is_registry_url


@pytest.mark.parametrize(
    ("url", "endpoint", "base"),
    [
        ("consul://127.0.0.1:8500/rpcx", "127.0.0.1:8500", "/rpcx"),
        ("consul://consul.internal", "consul.internal:8500", "/rpcx"),
        ("consul://[::1]:9500/a/b", "[::1]:9500", "/a/b"),
    ],
)
def test_consul_urls(url: str, endpoint: str, base: str) -> None:
    r = RegistryURL.parse(url)
    assert (r.kind, r.endpoint, r.base) == ("consul", endpoint, base)
    assert is_registry_url(url)
    discovery = r.discovery("Arith")
    assert isinstance(discovery, ConsulDiscovery)
    assert discovery.prefix == f"{base[1:]}/Arith/"


@pytest.mark.parametrize(
    ("url", "error"),
    [
        ("consul://h:8500/rpcx?dc=x", "takes no query"),
        ("consul://u:p@h/rpcx", "user and password are not supported"),
        ("consul://h:8500/", "the base path must name a key"),
    ],
)
def test_bad_consul_urls(url: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        RegistryURL.parse(url)


def test_a_ttl_consul_would_refuse_is_an_error() -> None:
    with pytest.raises(ValueError, match="ttl must be >= 20"):
        ConsulRegistrar("127.0.0.1:8500", ttl=10)
    with pytest.raises(ValueError, match="must name a key"):
        ConsulRegistrar("127.0.0.1:8500", base="/")
    with pytest.raises(ValueError, match="HOST:PORT or http://HOST:PORT"):
        ConsulHTTP("https://127.0.0.1:8500")


def test_keys_as_libkv_writes_them() -> None:
    assert ConsulRegistrar("h:8500", base="/rpcx").key("Arith", "tcp@1.2.3.4:5") == "rpcx/Arith/tcp@1.2.3.4:5"
    assert ConsulRegistrar("h:8500", base="services/rpcx/").key("A", "tcp@h:1") == "services/rpcx/A/tcp@h:1"
    assert ConsulDiscovery("h:8500", "Arith", base="/rpcx").directory == "rpcx/Arith"


def test_go_formats() -> None:
    assert _go_duration(10) == "10s"
    assert _go_duration(12.5) == "12.5s"
    # url.Values.Encode: keys sorted, values query-escaped, blank values kept
    assert _reencode("weight=2&state=inactive&group=a b&x") == "group=a+b&state=inactive&weight=2&x="
