"""Typed configuration of the balancer, and its TOML loader.

The dataclasses validate in ``__post_init__`` and raise
:class:`BalancerConfigError` with a message naming the field. They are the
one definition of the configuration: ``rustext.Balancer`` reads these objects
directly (their fields, and the views derived here for it:
:meth:`BalancerConfig.effective_listeners`, :meth:`BalancerConfig.backend_pools`,
:attr:`BalancerConfig.policy`). Durations are seconds (floats); ``0`` means
"none" where documented.

A file looks like::

    listen = "0.0.0.0:8080"
    admin = "127.0.0.1:9090"          # optional admin/metrics endpoint
    workers = 4                       # default: number of cores
    algorithm = "round_robin"         # weighted_round_robin, least_connections,
                                      # random_two, consistent_hash
    hash_key = "client_ip"            # path, header:NAME (consistent_hash)
    retries = 2
    proto = "h1"                      # to the backends; "h2" for HTTP/2 (gRPC)

    [timeouts]
    connect = 3.0
    header = 10.0     # client request head (slowloris guard)
    response = 30.0   # backend response head
    idle = 60.0       # keep-alive client connection
    total = 0         # whole exchange, body included (0 = none)
    queue = 5.0       # wait for a backend slot (max_connections)

    [passive]
    eject_after = 3   # consecutive failures (0 = never)
    cooldown = 10.0

    [limits]
    max_connections = 0        # per backend (0 = unlimited)
    max_header_bytes = 65536
    pool_max_idle = 64         # idle keep-alive connections per backend per worker
    pool_idle_timeout = 60.0

    [health]                   # active checks (omit or enabled = false to disable)
    path = "/health"
    interval = 2.0
    timeout = 1.0
    rise = 2
    fall = 3

    [[backends]]
    address = "127.0.0.1:9001"
    weight = 3
    max_connections = 100

    [[backends]]
    address = "app.internal:8080"   # by name: resolved every dns.interval (balancer.discovery)

    [dns]                      # omit: names are resolved once, at load
    nameservers = ["10.0.0.53"]   # default: /etc/resolv.conf
    interval = 5.0

    [admin_auth]               # credentials for the admin endpoint (balancer.auth)
    users_file = "admin.htpasswd"
    public = ["/metrics"]
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from balancer.accesslog import AccessLog
from balancer.acme.settings import Acme
from balancer.auth import AdminAuth
from balancer.checks import (  # noqa: F401  (re-exported: the configuration's own checks)
    PROTOS,
    check_count,
    check_h2_limits,
    check_proto,
    check_send_proxy,
    check_unix_path,
    is_token,
    parse_hostport,
    unix_path,
)
from balancer.compression import Compression, compression
from balancer.config_sections import HEALTH_TYPES as HEALTH_TYPES  # noqa: PLC0414  (re-exported, as are the sections)
from balancer.config_sections import (
    Certificate,
    HealthCheck,
    Limits,
    Passive,
    Timeouts,
    Tls,
)
from balancer.discovery import DnsConfig, Target, is_ip
from balancer.errorpages import ErrorPage, load_error_pages
from balancer.errors import BalancerConfigError
from balancer.policies import (
    Policy,
    Sticky,
    check_cookie_value,
    parse_duration,
    parse_retry_on,
    pool_policy,
)
from balancer.ratelimit import RateLimit
from balancer.routing import (
    HeaderRules,
    Hsts,
    Listener,
    NamedBackend,
    RequestId,
    Route,
    section,
)
from rustext.fields import check_fields
from rustext.tomllines import read_toml

#: the pool of a configuration with a ``[[backends]]`` list instead of named pools
DEFAULT_POOL = "default"

ALGORITHMS = ("round_robin", "weighted_round_robin", "least_connections", "random_two", "consistent_hash")
ALGORITHM_ALIASES = {
    "rr": "round_robin",
    "wrr": "weighted_round_robin",
    "least_conn": "least_connections",
    "p2c": "random_two",
    "random_two_choices": "random_two",
    "hash": "consistent_hash",
    "ketama": "consistent_hash",
}


@dataclass(frozen=True, kw_only=True)
class BackendConfig:
    """One backend server, or every address a DNS name gives (see ``[dns]``)."""

    #: ``host:port``, or ``unix:/path`` for a Unix socket; the backend's identity across reloads.
    #: A host name is resolved once at load,
    #: or every ``dns.interval`` when the ``[dns]`` table is present (one backend per address)
    address: str = ""
    weight: int = 1  # 0..10000; 0 takes no traffic
    max_connections: int = 0  # concurrent requests to this backend; 0 = limits.max_connections
    #: instead of ``address``: an SRV name (``_http._tcp.app.internal``) giving targets, ports and weights
    srv: str | None = None
    #: the addresses a name gives: ``"any"`` (A and AAAA), ``"ipv4"`` (A) or ``"ipv6"`` (AAAA)
    resolve: str = "any"
    #: a PROXY protocol header on each new connection to this server: ``"v1"``, ``"v2"`` or ``"none"``;
    #: unset: the pool's ``send_proxy``
    send_proxy: str | None = None
    #: a backup server: used only when no other server of its pool is available (HAProxy's ``backup``)
    backup: bool = False
    #: this server's slow start (``"30s"`` or seconds); unset: the pool's ``slow_start``
    slow_start: float | str | None = None
    #: its value of the pool's ``sticky`` cookie (letters, digits, ``-._~``); unset: 16 hex digits
    #: derived from ``address``
    cookie: str | None = None

    @property
    def key(self) -> str:
        """The backend's identity in the config: its address, or ``srv:NAME``."""
        return f"srv:{self.srv}" if self.srv is not None else self.address

    def __post_init__(self) -> None:
        check_send_proxy(self.send_proxy, f"backend {self.address or self.srv} send_proxy")
        if self.resolve not in ("any", "ipv4", "ipv6"):
            raise BalancerConfigError(f"backend resolve must be any, ipv4 or ipv6, got {self.resolve!r}")
        if self.srv is not None:
            if self.address:
                raise BalancerConfigError(f"backend {self.address}: give address or srv, not both")
            if not isinstance(self.srv, str) or not self.srv.strip(".") or " " in self.srv:
                raise BalancerConfigError(f"backend srv must be a DNS name, got {self.srv!r}")
        elif not self.address:
            raise BalancerConfigError("a backend needs address = \"host:port\" or srv = \"_service._proto.name\"")
        elif (path := unix_path(self.address)) is not None:
            check_unix_path(path, "backend address")
        else:
            host, _ = parse_hostport(self.address, "backend address")
            if any(c in host for c in "/@ \t"):  # a URL or user@host: the data plane would refuse it
                raise BalancerConfigError(f"backend address must be host:port, got {self.address!r}")
        if isinstance(self.weight, bool) or not isinstance(self.weight, int) or not 0 <= self.weight <= 10_000:
            raise BalancerConfigError(f"backend {self.address} weight must be an integer in 0..10000, got {self.weight!r}")
        check_count(self.max_connections, f"backend {self.address} max_connections")
        if self.slow_start is not None:
            parse_duration(self.slow_start, f"backend {self.address} slow_start")
        if self.cookie is not None:
            check_cookie_value(self.cookie, self.address)


@dataclass(frozen=True, kw_only=True)
class BalancerConfig:
    """The whole balancer: listener, backends, policy, and the sections below."""

    #: ``host:port`` (or ``unix:/path``) clients connect to (a reload moves it); or ``[[listeners]]``
    listen: str = ""
    #: the backends (``[[backends]]`` tables, or ``"host:port"`` strings)
    backends: tuple[BackendConfig, ...] = ()
    #: round_robin, weighted_round_robin, least_connections, random_two or consistent_hash
    algorithm: str = "round_robin"
    #: what consistent_hash hashes: client_ip, path or header:NAME (no such header: the client IP)
    hash_key: str = "client_ip"
    #: data-plane threads, each with its own listener, pools and stats (a change needs a restart)
    workers: int = field(default_factory=lambda: os.cpu_count() or 1, metadata={"default": "the number of CPUs"})
    #: further backends tried for a request that fails before its response started (0..16)
    retries: int = 2
    #: ``host:port`` of the admin and metrics endpoint; unset = none (a change needs a restart)
    admin: str | None = None
    #: a Unix socket path where this process hands its listening sockets over to a new
    #: process started with ``--takeover PATH`` (a binary upgrade); unset = none (a change needs a restart)
    handover_socket: str | None = None
    #: the ``[timeouts]`` table
    timeouts: Timeouts = field(default_factory=Timeouts)
    #: the ``[passive]`` table
    passive: Passive = field(default_factory=Passive)
    #: the ``[limits]`` table
    limits: Limits = field(default_factory=Limits)
    #: the ``[health]`` table; unset = no active checks
    health: HealthCheck | None = None
    #: the ``[tls]`` table: HTTPS on ``listen``, the HTTP redirect, TLS to backends
    tls: Tls = field(default_factory=Tls)
    #: the ``[acme]`` table: a certificate for the listener obtained and renewed from an ACME CA
    #: (Let's Encrypt); unset = the ``[tls]`` certificates only (a change needs a restart)
    acme: Acme | None = None
    #: named backend pools: the ``[backends.NAME]`` tables (instead of a ``[[backends]]`` list)
    named_backends: Mapping[str, NamedBackend] = field(default_factory=dict)
    #: the routes of ``listen`` (``[[routes]]``), tried in order; the first that holds wins
    routes: tuple[Route, ...] = ()
    #: the pool of requests no route of ``listen`` takes; unset: ``default`` with a ``[[backends]]``
    #: list, else they get ``503``
    default_backend: str | None = None
    #: request ids on ``listen`` (``request_id = { header = "X-Request-ID" }``)
    request_id: RequestId | None = None
    #: HSTS on ``listen`` when it serves HTTPS (``hsts = { max_age = 31536000 }``)
    hsts: Hsts | None = None
    #: header rules on every request forwarded from ``listen`` (``[request_headers]``)
    request_headers: HeaderRules = field(default_factory=HeaderRules)
    #: header rules on every backend response sent from ``listen`` (``[response_headers]``)
    response_headers: HeaderRules = field(default_factory=HeaderRules)
    #: response compression on ``listen`` (``compress = true``, or a ``[compress]`` table: see
    #: :class:`balancer.compression.Compression`); unset: none
    compress: Compression | bool | None = None
    #: several listeners (``[[listeners]]``), each with its routes, instead of ``listen``
    listeners: tuple[Listener, ...] = ()
    #: the ``[dns]`` table: backends given by name are resolved again every ``interval``; unset = once,
    #: at load (``srv`` backends then use the table's defaults)
    dns: DnsConfig | None = None
    #: the ``[admin_auth]`` table: credentials asked of admin requests; unset = none (applied on reload)
    admin_auth: AdminAuth | None = None
    #: the ``[access_log]`` table: one line per request; unset = no access log
    access_log: AccessLog | None = None
    #: connections to ``listen`` start with a PROXY protocol header (v1 or v2, as HAProxy's
    #: ``accept-proxy``) giving the client's address (a change needs a restart)
    accept_proxy: bool = False
    #: with certificates in ``[tls]``: HTTP/3 over QUIC on ``listen`` as well (the same port, over UDP),
    #: advertised by ``Alt-Svc``; ``false``: HTTPS over TCP only
    http3: bool = True
    #: new connections to the backends start with a PROXY protocol header carrying the client's address:
    #: ``"v1"`` (HAProxy's ``send-proxy``), ``"v2"`` (``send-proxy-v2``) or ``"none"``; such connections
    #: serve one client connection only (never shared through the keep-alive pool)
    send_proxy: str = "none"
    #: the ``[rate_limit]`` table: requests per client address or header, over every listener;
    #: unset = none (reloadable: the counts carry over while ``key`` and ``max_keys`` stay)
    rate_limit: RateLimit | None = None
    #: the ``[error_pages]`` table, ``503 = "/etc/balancer/503.http"``: pages answered instead of the
    #: balancer's own one-line texts (HAProxy's ``errorfile``): a whole HTTP response as HAProxy's
    #: files are, or a body typed by its extension; read at load and on every reload
    error_pages: tuple[ErrorPage, ...] = field(
        default=(), metadata={"type": "table of status = file", "default": "none"})
    #: with backup servers: balance over all of them when no other server is available (HAProxy's
    #: ``option allbackups``); false: the first available backup in the order listed
    all_backups: bool = False
    #: a server coming back (health check up, back from ejection or ``down``, added by a reload or DNS)
    #: gets a share of its traffic growing from 0 to full over this period (``"30s"`` or seconds; 0 = none)
    slow_start: float | str = 0
    #: also send a replayable request to another server after these responses: statuses (``"503"``),
    #: ``"response-timeout"``, ``"all-retryable-errors"`` (HAProxy's ``retry-on``), within ``retries``
    retry_on: tuple[str, ...] = ()
    #: the ``[sticky]`` table: cookie persistence for every pool; unset = none
    sticky: Sticky | None = None
    #: the protocol spoken to the backends: ``h1`` (HTTP/1.1) or ``h2`` (HTTP/2: h2c with prior knowledge
    #: to plain backends, ALPN ``h2`` over TLS, as HAProxy's ``server ... proto h2``); gRPC backends need ``h2``
    proto: str = "h1"
    #: with ``proto = "h2"``: concurrent streams on one connection to a server before another is opened
    #: (1..1000; a server's own lower ``SETTINGS_MAX_CONCURRENT_STREAMS`` wins)
    h2_max_streams: int = 100
    #: with ``proto = "h2"``: connections to one server per worker (1..64); past them, requests share
    #: the least loaded one
    h2_connections: int = 8

    def __post_init__(self) -> None:
        object.__setattr__(self, "compress", compression(self.compress, "compress"))
        if self.listeners:
            if self.listen:
                raise BalancerConfigError("give listen or [[listeners]], not both")
            object.__setattr__(self, "listeners", tuple(
                x if isinstance(x, Listener) else section(Listener, x, f"listeners[{i}]")
                for i, x in enumerate(self.listeners)))
            for name in ("routes", "default_backend", "request_id", "hsts", "request_headers", "response_headers",
                         "accept_proxy", "compress", "http3"):
                if getattr(self, name) != getattr(_DEFAULTS, name, None):
                    raise BalancerConfigError(f"{name} belongs in each [[listeners]] table when there are listeners")
            seen_addr: set[str] = set()
            for i, x in enumerate(self.listeners):
                if x.address in seen_addr and not x.address.endswith(":0"):
                    raise BalancerConfigError(f"listeners[{i}].address {x.address} is listed twice")
                seen_addr.add(x.address)
                if x.tls and not self.tls.certificates:
                    raise BalancerConfigError(f"listeners[{i}].tls needs certificates in [tls]")
                if x.client_verify is not None and self.tls.client_ca is None:
                    raise BalancerConfigError(f"listeners[{i}].client_verify needs tls.client_ca")
        else:
            if not self.listen:
                raise BalancerConfigError("'listen' is required (\"host:port\"), or [[listeners]] tables")
            if (path := unix_path(self.listen)) is not None:
                check_unix_path(path, "listen")
            else:
                parse_hostport(self.listen, "listen")
            if self.hsts is not None and not self.tls.certificates:
                raise BalancerConfigError("hsts needs HTTPS on listen (certificates in [tls])")
        if self.backends and self.named_backends:
            raise BalancerConfigError("backends is either a [[backends]] list or [backends.NAME] tables, not both")
        if "" in self.named_backends:
            raise BalancerConfigError("a backend pool needs a name ([backends.NAME]), not \"\"")
        names = set(self.named_backends) or {DEFAULT_POOL}
        for where, name in (x for lst in self.effective_listeners() for x in lst.backends_used()):
            if name not in names:
                raise BalancerConfigError(
                    f"{where}: no backend named {name!r} (known: {', '.join(sorted(names))})")
        if self.named_backends:
            self.pools()  # each pool complete and valid
        if self.admin is not None:
            parse_hostport(self.admin, "admin")
        if self.handover_socket is not None and not self.handover_socket.strip():
            raise BalancerConfigError("handover_socket: give the path of a Unix socket")
        check_send_proxy(self.send_proxy, "send_proxy")
        object.__setattr__(self, "backends", tuple(self.backends))
        algorithm = ALGORITHM_ALIASES.get(self.algorithm.replace("-", "_"), self.algorithm.replace("-", "_"))
        if algorithm not in ALGORITHMS:
            raise BalancerConfigError(f"algorithm must be one of {', '.join(ALGORITHMS)}; got {self.algorithm!r}")
        object.__setattr__(self, "algorithm", algorithm)
        if self.hash_key not in ("client_ip", "path") and not (
            self.hash_key.startswith("header:") and is_token(self.hash_key[7:].strip())
        ):
            raise BalancerConfigError(f"hash_key must be client_ip, path or header:NAME; got {self.hash_key!r}")
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or not 1 <= self.workers <= 1024:
            raise BalancerConfigError(f"workers must be an integer in 1..1024, got {self.workers!r}")
        check_proto(self.proto, "proto")
        check_h2_limits(self.h2_max_streams, self.h2_connections, "")
        if self.proto == "h2" and (self.send_proxy != "none" or any(
                b.send_proxy not in (None, "none") for b in self.backends)):
            raise BalancerConfigError(
                "send_proxy needs proto = \"h1\": HTTP/2 backend connections carry the calls of many clients")
        if self.passive.on_error == "mark-down" and self.health is None and not self.named_backends:
            raise BalancerConfigError(
                "passive.on_error = \"mark-down\" needs active health checks ([health]): they bring a server "
                "marked down back")
        if self.health is not None and self.health.type == "grpc" and self.proto != "h2" and not self.named_backends:
            raise BalancerConfigError(
                "health.type = \"grpc\" needs proto = \"h2\": gRPC runs over HTTP/2 only")
        if self.health is not None and self.health.port is not None and any(
                unix_path(b.address) is not None for b in self.backends):
            raise BalancerConfigError("health.port does not apply to servers on a Unix socket: they have no port")
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or not 0 <= self.retries <= 16:
            raise BalancerConfigError(f"retries must be an integer in 0..16, got {self.retries!r}")
        parse_duration(self.slow_start, "slow_start")
        object.__setattr__(self, "retry_on", parse_retry_on(self.retry_on))
        cookies = [b.cookie for b in self.backends if b.cookie is not None]
        if len(set(cookies)) != len(cookies):
            twice = next(c for c in cookies if cookies.count(c) > 1)
            raise BalancerConfigError(f"two servers have the cookie {twice!r}: each needs its own")
        if self.sticky is not None and not isinstance(self.sticky, Sticky):
            object.__setattr__(self, "sticky", section(Sticky, self.sticky, "sticky"))
        seen: set[str] = set()
        for b in self.backends:
            if b.key in seen:
                raise BalancerConfigError(f"backend {b.srv if b.srv is not None else b.address} is listed twice")
            seen.add(b.key)
        statuses = [p.status for p in self.error_pages]
        if len(set(statuses)) != len(statuses):
            twice = next(s for s in statuses if statuses.count(s) > 1)
            raise BalancerConfigError(f"error_pages: two pages for {twice}")

    def dns_targets(self) -> dict[str, Target]:
        """The backends resolved by :class:`balancer.discovery.Discovery`, by key:
        every ``srv`` backend, and, with a ``[dns]`` table, every address by name.
        The key is the backend's :attr:`BackendConfig.key`, prefixed by
        ``POOL/`` for the servers of a named pool (``[backends.NAME]``)."""
        out = {}
        for pool, b in self.configured_servers():
            key = b.key if pool is None else f"{pool}/{b.key}"
            if b.srv is not None:
                out[key] = Target(key, "srv", b.srv.rstrip("."), 0, b.resolve)
            elif self.dns is not None and unix_path(b.address) is None:
                host, port = parse_hostport(b.address, "backend address")
                if not is_ip(host):
                    out[key] = Target(key, "a", host.rstrip("."), port, b.resolve)
        return out

    def configured_servers(self) -> list[tuple[str | None, BackendConfig]]:
        """(pool, server) as written in the file, names unresolved; pool is
        None for the top-level ``[[backends]]`` list."""
        out: list[tuple[str | None, BackendConfig]] = [(None, b) for b in self.backends]
        for name, nb in self.named_backends.items():
            out.extend((name, b) for b in _servers(nb, f"backends.{name}"))
        return out

    def with_discovered(self, expand: Callable[[str, BackendConfig], list[BackendConfig] | None]) -> BalancerConfig:
        """This configuration with each server replaced by ``expand(key, server)``
        (the key as in :meth:`dns_targets`); None keeps the server as it is.
        A pool may end up empty (no address yet): it then answers 503."""
        def pool(prefix: str, servers: Iterable[BackendConfig]) -> tuple[BackendConfig, ...]:
            out: dict[str, BackendConfig] = {}
            for b in servers:
                got = expand(prefix + b.key, b)
                for x in (b,) if got is None else got:
                    out.setdefault(x.address, x)
            return tuple(out.values())
        named = {name: replace(nb, servers=pool(f"{name}/", _servers(nb, f"backends.{name}")), discovered=True)
                 for name, nb in self.named_backends.items()}
        return replace(self, backends=pool("", self.backends), named_backends=named)

    def effective_listeners(self) -> tuple[Listener, ...]:
        """``[[listeners]]``, or the one listener ``listen`` and its top-level keys make."""
        if self.listeners:
            return self.listeners
        default = self.default_backend
        if default is None and not self.named_backends:
            default = DEFAULT_POOL
        return (Listener(address=self.listen, tls=bool(self.tls.certificates), routes=self.routes,
                         default_backend=default, request_id=self.request_id, hsts=self.hsts,
                         request_headers=self.request_headers, response_headers=self.response_headers,
                         where="", accept_proxy=self.accept_proxy, compress=self.compress,
                         http3=self.http3),)

    def pools(self) -> dict[str, BalancerConfig]:
        """Each backend pool as a configuration of its own (servers, policy,
        health), the top-level values filling what a pool leaves out."""
        if not self.named_backends:
            return {DEFAULT_POOL: self}
        out = {}
        for name, nb in self.named_backends.items():
            w = f"backends.{name}"
            servers = _servers(nb, w)
            if not servers and not nb.discovered:
                raise BalancerConfigError(f"{w}.servers must list at least one \"host:port\"")
            timeouts = self.timeouts if nb.timeouts is None else section(
                Timeouts, {**_as_dict(self.timeouts), **nb.timeouts}, f"{w}.timeouts")
            passive = self.passive if nb.passive is None else _pool_section(
                Passive, {**_as_dict(self.passive), **nb.passive}, w, "passive")
            limits = self.limits if nb.max_connections is None else replace(
                self.limits, max_connections=nb.max_connections)
            if nb.rate_limit is not None:
                _pool_section(RateLimit, nb.rate_limit, w, "rate_limit")
            health = self.health
            if nb.health is not None:
                base = _as_dict(self.health) if self.health is not None else {}
                if nb.health.get("type", base.get("type", "http")) != base.get("type", "http"):
                    # a pool switching type does not inherit the other type's target
                    base = {k: v for k, v in base.items()
                            if k not in ("type", "path", "method", "grpc_service", "expect_status", "expect_body")}
                h = _pool_section(HealthCheck, {**base, **nb.health}, w, "health")
                health = h if h.enabled else None
            if passive.on_error == "mark-down" and health is None:
                key = f"{w}.passive.on_error" if nb.passive is not None and "on_error" in nb.passive else "passive.on_error"
                raise BalancerConfigError(
                    f"{key} = \"mark-down\" needs active health checks for [{w}]: they bring a server marked "
                    "down back")
            if health is not None and health.type == "grpc" and (nb.proto or self.proto) != "h2":
                key = f"{w}.health.type" if nb.health is not None and "type" in nb.health else "health.type"
                raise BalancerConfigError(
                    f"{key} = \"grpc\" needs proto = \"h2\" in [{w}]: gRPC runs over HTTP/2 only")
            try:
                out[name] = replace(
                    self, listen=self.listen or "0.0.0.0:0", listeners=(), named_backends={}, routes=(),
                    default_backend=None, request_id=None, hsts=None, request_headers=HeaderRules(),
                    response_headers=HeaderRules(), backends=servers,
                    algorithm=nb.algorithm or self.algorithm, hash_key=nb.hash_key or self.hash_key,
                    retries=self.retries if nb.retries is None else nb.retries,
                    send_proxy=self.send_proxy if nb.send_proxy is None else nb.send_proxy,
                    timeouts=timeouts, passive=passive, limits=limits, health=health,
                    all_backups=self.all_backups if nb.all_backups is None else nb.all_backups,
                    slow_start=self.slow_start if nb.slow_start is None else nb.slow_start,
                    retry_on=self.retry_on if nb.retry_on is None else nb.retry_on,
                    sticky=self.sticky if nb.sticky is None else (
                        None if nb.sticky is False else section(Sticky, nb.sticky, f"{w}.sticky")),
                    proto=nb.proto or self.proto,
                    h2_max_streams=self.h2_max_streams if nb.h2_max_streams is None else nb.h2_max_streams,
                    h2_connections=self.h2_connections if nb.h2_connections is None else nb.h2_connections)
            except BalancerConfigError as exc:
                raise BalancerConfigError(f"{w}: {exc}") from exc
        return out

    def all_backends(self) -> list[tuple[str, BackendConfig]]:
        """(pool, server) of every server of every pool."""
        return [(name, b) for name, pool in self.pools().items() for b in pool.backends]

    def backend_pools(self) -> tuple[BackendPool, ...]:
        """Every pool as the data plane runs it: :meth:`pools`, each with the
        header rules and rate limit of its ``[backends.NAME]`` table."""
        out = []
        for name, pool in self.pools().items():
            nb = self.named_backends.get(name)
            if nb is None:  # the [[backends]] list
                out.append(BackendPool(name=name, config=pool))
                continue
            where = f"backends.{name}"
            limit = None if nb.rate_limit is None else _pool_section(RateLimit, nb.rate_limit, where, "rate_limit")
            out.append(BackendPool(name=name, config=pool, request_headers=nb.request_headers,
                                   response_headers=nb.response_headers, rate_limit=limit, where=where))
        return tuple(out)

    @property
    def policy(self) -> Policy:
        """The policies of this configuration's servers as the data plane applies
        them (for a pool of :meth:`pools`: the pool's)."""
        return pool_policy(self)

    def fixed_changes(self, other: BalancerConfig) -> list[str]:
        """Settings that a reload cannot change in place (they need a restart)."""
        out = []
        for name in ("workers", "admin", "handover_socket", "acme"):
            if getattr(self, name) != getattr(other, name):
                out.append(name)
        # listeners come and go on reload; one that stays keeps its socket, and so its settings
        mine = {x.address: (x.tls, x.accept_proxy, x.mode, x.http3) for x in self.effective_listeners()}
        for x in other.effective_listeners():
            if x.address in mine and mine[x.address] != (x.tls, x.accept_proxy, x.mode, x.http3):
                out.append(f"the tls, accept_proxy, mode and http3 of listener {x.address} (it stays open as it was)")
        if self.tls != other.tls:
            out.append("tls (the same files are reloaded in place; other TLS changes need a restart)")
        for name in ("header", "idle"):
            if getattr(self.timeouts, name) != getattr(other.timeouts, name):
                out.append(f"timeouts.{name}")
        for name in ("max_header_bytes", "pool_max_idle", "pool_idle_timeout", "max_client_connections",
                     "max_open_connections"):
            if getattr(self.limits, name) != getattr(other.limits, name):
                out.append(f"limits.{name}")
        return out

    def with_backends(self, backends: list[BackendConfig]) -> BalancerConfig:
        return replace(self, backends=tuple(backends))


def _servers(nb: NamedBackend, where: str) -> tuple[BackendConfig, ...]:
    """A named pool's ``servers``, each a :class:`BackendConfig`."""
    return tuple(
        BackendConfig(address=b) if isinstance(b, str) else b if isinstance(b, BackendConfig)
        else section(BackendConfig, b, f"{where}.servers[{i}]") for i, b in enumerate(nb.servers))


@dataclass(frozen=True, kw_only=True)
class BackendPool:
    """One backend pool as the data plane runs it (see :meth:`BalancerConfig.backend_pools`)."""

    #: the pool's name (``default`` for a ``[[backends]]`` list)
    name: str
    #: the pool's configuration: its servers and policy, the top-level values filling the rest
    config: BalancerConfig
    #: header rules on the requests sent to the pool
    request_headers: HeaderRules = field(default_factory=HeaderRules)
    #: header rules on its responses
    response_headers: HeaderRules = field(default_factory=HeaderRules)
    #: the pool's own rate limit, checked after routing
    rate_limit: RateLimit | None = None
    #: the pool's key path in the file (``backends.NAME``; empty for a ``[[backends]]`` list)
    where: str = ""


def _as_dict(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


def _section(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise BalancerConfigError(f"[{where}] must be a table")
    known = {f.name for f in fields(cls) if not f.metadata.get("internal")}
    unknown = set(data) - known
    if unknown:
        raise BalancerConfigError(f"unknown key(s) in [{where}]: {', '.join(sorted(unknown))}")
    try:
        return cls(**check_fields(cls, data, where))
    except ValueError as exc:
        raise BalancerConfigError(str(exc)) from exc
    except TypeError as exc:
        raise BalancerConfigError(f"[{where}]: {exc}") from exc


def from_dict(data: dict[str, Any]) -> BalancerConfig:
    """Build a config from parsed TOML (or any dict of the same shape)."""
    if not isinstance(data, dict):
        raise BalancerConfigError("the configuration must be a table")
    data = dict(data)
    known = {f.name for f in fields(BalancerConfig)}
    unknown = set(data) - known
    if unknown:
        raise BalancerConfigError(f"unknown top-level key(s): {', '.join(sorted(unknown))}")
    if "listen" not in data and "listeners" not in data:
        raise BalancerConfigError("'listen' is required (\"host:port\"), or [[listeners]] tables")
    if "named_backends" in data:
        raise BalancerConfigError("unknown top-level key(s): named_backends (named pools are [backends.NAME] tables)")
    raw_backends = data.pop("backends", None) or []
    if isinstance(raw_backends, dict):
        data["named_backends"] = {
            name: section(NamedBackend, nb, f"backends.{name}") for name, nb in raw_backends.items()}
        raw_backends = []
    if not isinstance(raw_backends, (list, tuple)):
        raise BalancerConfigError("'backends' must be an array of \"host:port\" strings or tables")
    backends = []
    for i, b in enumerate(raw_backends):
        if isinstance(b, str):
            backends.append(BackendConfig(address=b))
        else:
            backends.append(_section(BackendConfig, b, f"backends[{i}]"))
    data["backends"] = tuple(backends)
    for key, cls in (("timeouts", Timeouts), ("passive", Passive), ("limits", Limits)):
        if key in data:
            data[key] = _section(cls, data[key], key)
    if "acme" in data:
        acme = data["acme"] = _section(Acme, data["acme"], "acme")
        data.setdefault("tls", {})
    if "tls" in data:
        raw = data["tls"]
        if isinstance(raw, dict) and ("certificates" in raw or "acme" in data):
            certs = raw.get("certificates", [])
            if not isinstance(certs, list):
                raise BalancerConfigError("tls.certificates must be an array of {cert, key} tables")
            managed = (acme_certificate(acme),) if "acme" in data else ()
            raw = {**raw, "certificates": managed + tuple(
                _section(Certificate, c, f"tls.certificates[{i}]") for i, c in enumerate(certs))}
        data["tls"] = _section(Tls, raw, "tls")
    if "dns" in data:
        data["dns"] = _section(DnsConfig, data["dns"], "dns")
    if "admin_auth" in data:
        data["admin_auth"] = _section(AdminAuth, data["admin_auth"], "admin_auth")
    if "access_log" in data:
        data["access_log"] = _section(AccessLog, data["access_log"], "access_log")
    if "rate_limit" in data:
        data["rate_limit"] = _section(RateLimit, data["rate_limit"], "rate_limit")
    if "error_pages" in data:
        data["error_pages"] = load_error_pages(data["error_pages"])
    if "sticky" in data:
        data["sticky"] = _section(Sticky, data["sticky"], "sticky")
    if "retry_on" in data:
        data["retry_on"] = parse_retry_on(data["retry_on"])
    if "health" in data:
        health = _section(HealthCheck, data["health"], "health")
        data["health"] = health if health.enabled else None
    for key, cls in (("request_id", RequestId), ("hsts", Hsts), ("request_headers", HeaderRules),
                     ("response_headers", HeaderRules)):
        if key in data:
            data[key] = section(cls, data[key], key)
    for key, cls in (("routes", Route), ("listeners", Listener)):
        if key in data:
            if not isinstance(data[key], list):
                raise BalancerConfigError(f"{key} must be an array of tables ([[{key}]])")
            data[key] = tuple(section(cls, x, f"{key}[{i}]") for i, x in enumerate(data[key]))
    try:
        return BalancerConfig(**check_fields(BalancerConfig, data, ""))
    except BalancerConfigError:
        raise
    except ValueError as exc:
        raise BalancerConfigError(str(exc)) from exc
    except TypeError as exc:
        raise BalancerConfigError(str(exc)) from exc


def acme_certificate(acme: Acme) -> Certificate:
    """The listener's certificate kept by ACME in ``acme.storage`` (the default: listed first)."""
    return Certificate(cert=os.path.join(acme.storage, "cert.pem"), key=os.path.join(acme.storage, "key.pem"),
                       managed=True)


def load(path: str | os.PathLike[str]) -> BalancerConfig:
    """Read and validate a TOML file; raises BalancerConfigError naming the file."""
    try:
        text, data = read_toml(path)
    except ValueError as exc:
        raise BalancerConfigError(str(exc)) from exc
    try:
        return from_dict(data)
    except BalancerConfigError as exc:
        raise BalancerConfigError(_located(path, text, data, str(exc))) from exc


def _located(path: str | os.PathLike[str], text: str, data: dict[str, Any], message: str) -> str:
    """``FILE:LINE: message`` (naming the key when the message does not)."""
    from balancer import config_errors  # only once a file has failed

    key = _path_in_message(data, message) or config_errors.culprit(data, message, from_dict, BalancerConfigError)
    line = config_errors.line_of(config_errors.key_lines(text), key)
    names = [k for k in key if isinstance(k, str)]
    if names and names[-1] not in message:
        dotted = ".".join(str(k) if isinstance(k, str) else f"[{k}]" for k in key).replace(".[", "[")
        message = f"{dotted}: {message}"
    return f"{path}:{line}: {message}" if line is not None else f"{path}: {message}"


def _path_in_message(data: dict[str, Any], message: str) -> tuple[str | int, ...] | None:
    """The key path a message starts with (``listeners[0].routes[2].host: …``),
    when the file has it: routing errors name their key, including references
    between parts that the part-by-part search cannot see."""
    page = re.match(r"error_pages\.(\w+)[:\s]", message)
    if page and isinstance(data.get("error_pages"), dict) and page.group(1) in data["error_pages"]:
        return ("error_pages", page.group(1))  # its keys are statuses, not names
    unknown = re.match(r"unknown key\(s\) in \[?(\S+?)\]?: ([\w-]+)", message)
    if unknown:  # the first unknown key's line
        dotted = f"{unknown.group(1)}.{unknown.group(2)}"
    else:
        m = re.match(r"([A-Za-z_]\w*(?:\[\d+\]|\.[A-Za-z_][\w-]*)*)[:\s]", message)
        if not m:
            return None
        dotted = m.group(1)
    path: tuple[str | int, ...] = tuple(
        int(i) if i else k for i, k in re.findall(r"\[(\d+)\]|([A-Za-z_][\w-]*)", dotted))
    if len(path) > 1 and path[0] == "listen" and "listen" in data and not isinstance(data["listen"], dict):
        path = path[1:]  # the routing keys of the one listener are top-level keys
    routing = ("routes", "listeners", "default_backend", "request_id", "hsts", "request_headers", "response_headers")
    if not path or not (path[0] in routing or path[0] == "acme"
                        or (path[0] == "backends" and isinstance(data.get("backends"), dict))):
        return None  # other messages: the part-by-part search
    node: Any = data
    for n, k in enumerate(path):
        if isinstance(node, dict) and isinstance(k, str) and k in node or isinstance(node, list) and isinstance(k, int) and k < len(node):
            node = node[k]
        else:
            return path[:n] if n > 1 else None
    return path or None


def _pool_section(cls: type, data: Any, pool: str, key: str) -> Any:
    """A pool's table (``backends.NAME.KEY``): its errors, which start with ``KEY.``, name the
    pool's key, so that they are located on its line."""
    try:
        return section(cls, data, f"{pool}.{key}")
    except BalancerConfigError as exc:
        msg = str(exc)
        raise BalancerConfigError(f"{pool}.{msg}" if msg.startswith(f"{key}.") else msg) from exc


def parse_backends(spec: str) -> list[BackendConfig]:
    """``host:port[=weight],host:port,...`` (the CLI's --backends)."""
    out = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        address, _, weight = item.partition("=")
        try:
            w = int(weight) if weight else 1
        except ValueError:
            raise BalancerConfigError(f"backend weight must be an integer in {item!r}") from None
        out.append(BackendConfig(address=address, weight=w))
    if not out:
        raise BalancerConfigError("--backends needs at least one host:port")
    return out


_DEFAULTS = BalancerConfig.__new__(BalancerConfig)
for _f in fields(BalancerConfig):
    if _f.name in ("routes", "default_backend", "request_id", "hsts", "request_headers", "response_headers"):
        object.__setattr__(_DEFAULTS, _f.name, _f.default_factory() if callable(_f.default_factory) else _f.default)
