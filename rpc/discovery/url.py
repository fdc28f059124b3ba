"""A registry named by a URL, and an XClient routed through it (the CLI's
``juggler rpc call|bench etcd://…``).

- ``etcd://host:2379/BASE``  / ``etcds://…`` (HTTPS)   → ``EtcdDiscovery``
- ``redis://host:6379/BASE`` / ``rediss://…`` (TLS)    → ``RedisDiscovery``;
  ``?db=N`` picks the Redis database (default 0), ``user:password@`` as in
  any Redis URL; Go rpcx's key layout unless ``?layout=juggler`` (servers of
  the release before it)
- ``zookeeper://host:2181/BASE``                        → ``ZooKeeperDiscovery``
  (rpcx-zookeeper's layout; no TLS, no query)
- ``consul://host:8500/BASE``                           → ``ConsulDiscovery``
  (rpcx-consul's layout; HTTP, no TLS, no query)
- ``dns://NAME:PORT`` / ``dns+srv://NAME``              → ``DnsDiscovery``
  (A/AAAA or SRV records; nothing registers; ``?nameserver=``, ``interval=``,
  ``timeout=``: ``rpc.discovery.dns``)

The path is the base path, as ``juggler rpc serve --base`` registers under
it; no path means ``/rpcx`` (serve's default and rpcx's). ``RegistryRoute``
adds what rpcx's ``XClient`` is given besides discovery: the selector, the
fail mode, the retries and the group. Both are frozen, picklable values
(benchmark client processes receive them).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

from rpc.errors import NoServerAvailable, RegistryUnavailable

if TYPE_CHECKING:
    from rpc.discovery.base import WatchingDiscovery
    from rpc.xclient import XClient

#: URL scheme → (registry, over TLS, default port)
SCHEMES: dict[str, tuple[str, bool, int]] = {
    "etcd": ("etcd", False, 2379),
    "etcds": ("etcd", True, 2379),
    "redis": ("redis", False, 6379),
    "rediss": ("redis", True, 6379),
    "zookeeper": ("zookeeper", False, 2181),
    "consul": ("consul", False, 8500),
    "dns": ("dns", False, 0),
    "dns+srv": ("dns", False, 0),
}

DEFAULT_BASE = "/rpcx"


def is_registry_url(target: str) -> bool:
    """Whether ``target`` names a registry (``etcd://``, ``redis://``, …) rather than a server."""
    scheme, sep, _ = target.partition("://")
    return bool(sep) and scheme.lower() in SCHEMES


@dataclass(frozen=True, kw_only=True)
class RegistryURL:
    """A parsed registry URL: ``kind`` (etcd, redis), the ``endpoint`` its
    client connects to, the ``base`` path, and ``tls`` (a
    ``rustext.tls.ClientTls``, None = the system's trust store on a TLS scheme)."""

    kind: str
    endpoint: str
    base: str
    #: ``scheme://host:port`` without credentials, for messages
    display: str
    tls: Any = None
    #: Redis only: the key layout (``rpc.discovery.redis.Layout``: libkv, Go rpcx's; juggler, the earlier one)
    layout: str = "libkv"
    #: DNS only: the name resolved and how (``rpc.discovery.dns.DnsName``)
    dns: Any = None

    @classmethod
    def parse(cls, url: str, *, tls: Any = None) -> RegistryURL:
        """Raises ValueError with a one-line reason for a URL that is not a registry's."""
        expected = "expected etcd://HOST:PORT/BASE or redis://HOST:PORT/BASE (etcds://, rediss:// over TLS)" \
                   " or zookeeper://HOST:PORT/BASE or consul://HOST:PORT/BASE or dns://NAME:PORT or dns+srv://NAME"
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in SCHEMES or "://" not in url:
            raise ValueError(f"not a registry URL: {url!r}; {expected}")
        kind, secure, default_port = SCHEMES[scheme]
        if kind == "dns":
            from rpc.discovery.dns import DnsName

            if tls is not None:
                raise ValueError(f"registry TLS options need an etcds:// or rediss:// URL, got {url!r}")
            name = DnsName.parse(url)
            return cls(kind=kind, endpoint=name.name, base="", display=name.display, dns=name)
        try:
            port = parts.port or default_port
        except ValueError:
            raise ValueError(f"bad port in registry URL {url!r}; {expected}") from None
        if not parts.hostname:
            raise ValueError(f"no host in registry URL {url!r}; {expected}")
        if parts.fragment:
            raise ValueError(f"registry URL {url!r} has a fragment; {expected}")
        if tls is not None and not secure:
            raise ValueError(f"registry TLS options need an etcds:// or rediss:// URL, got {url!r}")
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        query = parse_qsl(parts.query, keep_blank_values=True)
        base = parts.path or DEFAULT_BASE
        display = f"{scheme}://{host}:{port}"
        if kind == "etcd":
            if query:
                raise ValueError(f"etcd registry URL {url!r} takes no query")
            if parts.username or parts.password:
                raise ValueError(f"etcd registry URL {url!r}: user and password are not supported")
            endpoint = f"{'https' if secure else 'http'}://{host}:{port}"
        elif kind == "consul":
            if query:
                raise ValueError(f"consul registry URL {url!r} takes no query")
            if parts.username or parts.password:
                raise ValueError(f"consul registry URL {url!r}: user and password are not supported")
            if not base.strip("/"):
                raise ValueError(f"consul registry URL {url!r}: the base path must name a key, e.g. /rpcx")
            endpoint = f"{host}:{port}"
        elif kind == "zookeeper":
            if query:
                raise ValueError(f"zookeeper registry URL {url!r} takes no query")
            if parts.username or parts.password:
                raise ValueError(f"zookeeper registry URL {url!r}: user and password are not supported")
            if not base.strip("/"):
                raise ValueError(f"zookeeper registry URL {url!r}: the base path must name a node, e.g. /rpcx")
            endpoint = f"{host}:{port}"
        else:
            db, layout = "0", "libkv"
            for key, value in query:
                if key == "layout":
                    if value not in ("libkv", "juggler"):
                        raise ValueError(f"redis registry URL {url!r}: layout must be libkv or juggler, got {value!r}")
                    layout = value
                    continue
                if key != "db":
                    raise ValueError(f"redis registry URL {url!r}: unknown query parameter {key!r} "
                                     "(only db=N and layout=libkv|juggler)")
                if not value.isdigit():
                    raise ValueError(f"redis registry URL {url!r}: db must be a number, got {value!r}")
                db = value
            userinfo = parts.netloc.rpartition("@")[0]
            endpoint = f"{scheme}://{userinfo + '@' if userinfo else ''}{host}:{port}/{db}"
            return cls(kind=kind, endpoint=endpoint, base=base, display=display, tls=tls, layout=layout)
        return cls(kind=kind, endpoint=endpoint, base=base, display=display, tls=tls)

    @property
    def secure(self) -> bool:
        """Whether the registry is reached over TLS (etcds://, rediss://)."""
        return SCHEMES[self.display.partition("://")[0]][1]

    def discovery(self, service: str, *, refresh_interval: float = 0.5) -> WatchingDiscovery:
        """A (not yet started) discovery of ``service``'s servers in this registry."""
        if self.kind == "dns":
            from rpc.discovery.dns import DnsDiscovery

            return DnsDiscovery(self.dns)
        if self.kind == "etcd":
            from rpc.discovery.etcd import EtcdDiscovery

            return EtcdDiscovery(self.endpoint, service, base=self.base, refresh_interval=refresh_interval,
                                 tls=self.tls)
        if self.kind == "zookeeper":
            from rpc.discovery.zookeeper import ZooKeeperDiscovery

            return ZooKeeperDiscovery(self.endpoint, service, base=self.base, refresh_interval=refresh_interval)
        if self.kind == "consul":
            from rpc.discovery.consul import ConsulDiscovery

            return ConsulDiscovery(self.endpoint, service, base=self.base, refresh_interval=refresh_interval)
        from rpc.discovery.redis import RedisDiscovery, check_layout

        return RedisDiscovery(self.endpoint, service, base=self.base, refresh_interval=refresh_interval, tls=self.tls,
                              layout=check_layout(self.layout))


@dataclass(frozen=True, kw_only=True)
class RegistryRoute:
    """Calls through ``registry`` as rpcx's XClient makes them: ``selector``
    (a ``rpc.selector.make_selector`` name; rpcx's default: random),
    ``fail_mode`` (failfast, failover, failtry, failbackup; rpcx's default:
    failfast), ``retries`` and ``group`` (only servers registered with
    ``group=`` that name; "" = every server)."""

    registry: RegistryURL
    selector: str = "random"
    fail_mode: str = "failfast"
    retries: int = 3
    group: str = ""

    def __post_init__(self) -> None:
        from rpc.failmode import FailMode
        from rpc.selector import make_selector

        make_selector(self.selector)  # ValueError naming the known ones
        FailMode.parse(self.fail_mode)
        if self.retries < 0:
            raise ValueError("retries must be >= 0")

    @contextlib.asynccontextmanager
    async def xclient(self, service: str, caller: Any, *, codecs: Any = None, **options: Any) -> AsyncIterator[XClient]:
        """An XClient of ``service`` over ``caller`` (a ``ServerCaller``),
        with its discovery started and at least one server to call;
        ``options`` are more ``XClientOptions`` fields, ``codecs`` the XClient's. Raises
        ``RegistryUnavailable`` (registry not reachable) or
        ``NoServerAvailable`` (nothing registered for ``service`` under the
        base path, or nothing of ``group``), each with a one-line message."""
        from rpc.selector import make_selector
        from rpc.xclient import XClient, XClientOptions

        opts = XClientOptions(fail_mode=self.fail_mode, retries=self.retries, group=self.group, **options)
        discovery = self.registry.discovery(service)
        try:
            await discovery.start()
        except RegistryUnavailable as exc:
            cause = exc.__cause__ or exc
            raise RegistryUnavailable(f"cannot reach the registry {self.registry.display}: {cause}") from exc
        try:
            async with XClient(service, discovery, caller, selector=make_selector(self.selector),
                               options=opts, codecs=codecs) as xc:
                if not xc.servers:
                    raise NoServerAvailable(self._why_none(service, discovery.servers()))
                yield xc
        finally:
            await discovery.aclose()

    def _why_none(self, service: str, registered: dict[str, str]) -> str:
        where = f"for service {service} under {self.registry.base} in {self.registry.display}"
        if self.registry.kind == "dns":
            where = f"for service {service} at {self.registry.display}"
        if not registered:
            return f"no server registered {where}"
        n = f"{len(registered)} registered"
        if self.group:
            return f"no server of group {self.group!r} {where} ({n}, none of that group or active)"
        return f"no active server {where} ({n}, all marked state=inactive)"
