"""Proxies: the application's own backend decides who connects, subscribes
and publishes, and answers RPCs, over HTTP (JSON POST) or gRPC.

- config.py     ``[[proxy]]`` tables: kind, endpoint, timeout, match, headers, cookies
- mapping.py    the questions and answers of each kind, sans-I/O: JSON objects ⇄ typed results
- handshake.py  what a connect proxy is told of a handshake: allowed headers, cookies, token
- http.py       the HTTP transport (one aiohttp session per endpoint)
- grpc.py       the gRPC transport (one grpc.aio channel per endpoint); proxy.proto and its
                generated proxy_pb2.py / proxy_pb2_grpc.py (``python -m juggler.proxy.generate``)
- registry.py   ProxySet: which proxy answers what, the hooks of the connection driver, lifecycle
- stats.py      counters per proxy and their Prometheus exposition
- errors.py     ProxyError and its kinds (unavailable, timeout, bad answer), with their codes
"""

from juggler.proxy.config import ProxyConfig, proxies_from_toml
from juggler.proxy.errors import (
    ProxyBadAnswer,
    ProxyError,
    ProxyTimeout,
    ProxyUnavailable,
)
from juggler.proxy.mapping import (
    ConnectResult,
    PublishResult,
    RefreshResult,
    Refusal,
    RpcResult,
)
from juggler.proxy.registry import ProxyRefusal, ProxySet
from juggler.proxy.stats import ProxyCollector, ProxyStats

__all__ = [
    "ConnectResult",
    "ProxyBadAnswer",
    "ProxyCollector",
    "ProxyConfig",
    "ProxyError",
    "ProxyRefusal",
    "ProxySet",
    "ProxyStats",
    "ProxyTimeout",
    "ProxyUnavailable",
    "PublishResult",
    "RefreshResult",
    "Refusal",
    "RpcResult",
    "proxies_from_toml",
]
