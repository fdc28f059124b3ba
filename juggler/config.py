"""Typed configuration of the juggler server, loadable from TOML.

Every option is a keyword-only dataclass field with a documented default and
is validated in ``__post_init__``. A TOML file maps onto them section by
section; unknown keys are errors (a typo must not be silently ignored)::

    [server]
    listen = "127.0.0.1:9000"
    path = "/ws"
    allow_empty_subprotocol = false
    read_limit = 1048576        # bytes per incoming message, 0 = none
    write_limit = 0             # bytes per outgoing message, 0 = none
    read_timeout = 0            # seconds without any incoming message (pongs do not count), 0 = none
    ping_interval = 25          # seconds between websocket pings (and KEEPALIVE messages to clients that ask), 0 = none
    pong_timeout = 10           # seconds a ping may go unanswered (nothing received) before the connection is closed
    write_timeout = 10          # seconds a blocked write may wait, 0 = none
    handshake_timeout = 10
    slow_threshold = 0.5        # seconds; slower messages are logged, 0 = off
    call_timeout_ms = 60000     # default CALL timeout (upstream: 1 minute)
    answer_expired_calls = true # an error RES for a call whose timeout passed without a result
    max_pending = 1024          # messages queued per connection before reading pauses
    max_concurrent_messages = 16  # messages of one connection handled at once (ACKs stay in order)
    max_waiting_calls = 0       # calls ACKed and waiting for their RES, whole server (more: NACK 503), 0 = none
    max_subscriptions = 1000    # channels + patterns per connection (more: NACK 500), 0 = none
    max_write_buffer = 16777216 # bytes buffered per connection before it is closed
    close_timeout = 5           # seconds to drain connections at shutdown
    fallback = true             # the HTTP fallback (path + "/sse", path + "/send") for blocked websockets
    fallback_grace = 10         # seconds a fallback session waits for its dropped event stream to reopen
    debug_vars = false          # GET /debug/vars: the original's counters page (for its load tool)
    compression = false         # permessage-deflate with clients that offer it

    [redis]                      # present = use Redis instead of the in-memory broker
    url = "redis://127.0.0.1:6379/0"
    call_cap = 10000
    result_cap = 100000

    [memory]
    call_cap = 10000
    result_cap = 100000

    [metrics]
    port = 0                     # 0 = no metrics endpoint
    host = "127.0.0.1"

    [api]                        # present = serve the HTTP server API (juggler.api)
    listen = "127.0.0.1:9001"
    key = "..."                  # or JUGGLER_API_KEY; required unless insecure = true
    max_body = 1048576

    [[channels]]                 # per-channel history/presence (juggler.channels)
    match = "chat.*"
    history_size = 100

    [[proxy]]                    # the application's backend decides (juggler.proxy)
    kind = "connect"
    endpoint = "http://127.0.0.1:8000/juggler/connect"
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from juggler.broker.memory import MemoryBrokerConfig
from juggler.channels import ChannelRules
from rustext.fields import check_fields
from rustext.net import parse_hostport
from rustext.tls import ServerTls
from rustext.tomllines import read_toml

__all__ = ["ApiConfig", "AppConfig", "MetricsConfig", "ServerConfig", "load_config", "parse_listen"]


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (or ``:PORT``, ``[v6]:PORT``) → (host, port)."""
    return parse_hostport(listen, what="listen address", default_host="127.0.0.1")


@dataclass(frozen=True, kw_only=True, slots=True)
class ServerConfig:
    """Websocket server options: where it listens, limits per connection, timeouts, shutdown."""

    #: address to listen on
    host: str = "127.0.0.1"
    #: port to listen on (0: any free port, logged at start)
    port: int = 9000
    #: the websocket path; other paths get 404
    path: str = "/ws"
    #: serve clients that offer no subprotocol at all (one offering only others is still refused)
    allow_empty_subprotocol: bool = False
    #: max bytes of one incoming message (larger: close 1009); 0 = none
    read_limit: int = 1 << 20
    #: max bytes of one outgoing message (larger: the connection is closed); 0 = none
    write_limit: int = 0
    #: close a connection that sends no message for this long (s), however well it answers pings; 0 = never
    read_timeout: float = 0.0
    #: send every connection a websocket ping this often (s), and a KEEPALIVE message to
    #: clients that ask for one (``Juggler-Keepalive: 1``, or ``?juggler-keepalive=1``); 0 = no pings
    ping_interval: float = 25.0
    #: close a connection (code 1011, reason ``ping_timeout``) that sends nothing back this long (s)
    #: after a ping: a peer gone silent is closed within ping_interval + pong_timeout
    pong_timeout: float = 10.0
    #: close a connection whose writes stay blocked this long (s); 0 = never
    write_timeout: float = 10.0
    #: max seconds for the opening handshake
    handshake_timeout: float = 10.0
    #: log (and count) messages slower than this (s); 0 = off
    slow_threshold: float = 0.5
    #: timeout of a CALL that gives none (or under 1 ms)
    call_timeout_ms: int = 60_000
    #: answer a CALL whose timeout passed without a result with an error RES
    #: (``{"error": {"message": "call timed out: …"}}``), about a second after its
    #: deadline; false: stay silent, as the original
    answer_expired_calls: bool = True
    #: incoming messages queued per connection before reading pauses
    max_pending: int = 1024
    #: messages of one connection handled at once: calls, and publications to different
    #: channels, do not wait for each other (ACKs still go out in request order); 1 = one by one
    max_concurrent_messages: int = 16
    #: channels + patterns one connection may subscribe (more: NACK 500); 0 = no limit
    max_subscriptions: int = 1000
    #: bytes buffered for one slow reader before its connection is closed
    max_write_buffer: int = 16 << 20
    #: seconds connections get to close at shutdown before they are dropped
    close_timeout: float = 5.0
    #: websocket connections per server process (more: handshake refused with 503); 0 = none
    max_connections: int = 0
    #: messages/s one connection may send (token bucket); 0 = no limit
    rate_limit: float = 0.0
    #: bucket size (burst) of rate_limit; 0 = max(1, rate_limit)
    rate_burst: int = 0
    #: what a message over the rate gets: "nack" (NACK 429) or "close" (close 1008)
    rate_limit_action: str = "nack"
    #: CALLs of one connection ACKed and waiting for their RES (more: NACK 429); 0 = none
    max_inflight_calls: int = 0
    #: CALLs this server has ACKed and are waiting for their RES, all connections together (more:
    #: NACK 503 ``server overloaded``); 0 = none. Set it to what the callees serve within a call's
    #: timeout, and a load beyond their capacity is refused at once instead of timing out
    max_waiting_calls: int = 0
    #: server messages queued for one connection behind its handler chain before it is dropped
    max_outbound: int = 4096
    #: at shutdown, seconds in-flight calls get to be answered before connections close (1001)
    drain_timeout: float = 10.0
    #: log one line per connection open and close (with the reason)
    log_connections: bool = True
    #: answer ``GET /debug/vars`` on the websocket port with the original's counters page
    #: (juggler.debugvars), which the original load tool reads unless run with ``-V``
    debug_vars: bool = False
    #: write events to subscribers natively (one frame built per event, one write per connection);
    #: false writes each through Python (slower; for comparison)
    native_fanout: bool = True
    #: serve the HTTP fallback transport (``<path>/sse`` down, ``<path>/send`` up) for clients
    #: whose websockets a proxy refuses
    fallback: bool = True
    #: seconds a fallback session outlives its dropped event stream (a reopened one resumes it); 0 = none
    fallback_grace: float = 10.0
    #: events a fallback session keeps for a reopened stream (fewer missed than this: replayed)
    fallback_replay: int = 1024
    #: max bytes of one fallback POST body (larger: 413)
    fallback_max_body: int = 1 << 20
    #: agree to permessage-deflate (RFC 7692) with clients that offer it (browsers do); off by
    #: default, as in Centrifugo: it costs CPU per message (see the manual's Compression page)
    compression: bool = False
    #: messages shorter than this many bytes go out uncompressed
    compression_threshold: int = 256
    #: deflate level: 1 fastest .. 9 smallest (0 stores)
    compression_level: int = 1
    #: let clients compress with context takeover (their 32 KiB window is then held per
    #: connection); false asks them for client_no_context_takeover
    compression_client_context_takeover: bool = False
    #: PEM certificate chain: serve wss:// (and the HTTP pages over https) instead of ws://
    tls_cert: str | None = None
    #: PEM private key of ``tls_cert``
    tls_key: str | None = None
    #: PEM CA certificates client certificates must chain to (mutual TLS); none = no client certificates
    tls_client_ca: str | None = None

    def tls(self) -> ServerTls | None:
        """The TLS options, when ``tls_cert`` and ``tls_key`` are set."""
        if self.tls_cert is None:
            return None
        assert self.tls_key is not None
        return ServerTls(cert=self.tls_cert, key=self.tls_key, client_ca=self.tls_client_ca)

    def __post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("TLS needs both tls_cert and tls_key")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("tls_client_ca needs tls_cert and tls_key")
        if self.rate_limit_action not in ("nack", "close"):
            raise ValueError('rate_limit_action must be "nack" or "close"')
        for name in ("max_connections", "rate_limit", "rate_burst", "max_inflight_calls", "max_waiting_calls",
                     "drain_timeout"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.max_outbound < 1:
            raise ValueError("max_outbound must be >= 1")
        if not 0 <= self.port <= 65535:
            raise ValueError("port must be in 0..65535")
        if not self.path.startswith("/"):
            raise ValueError("path must start with '/'")
        for name in ("read_limit", "write_limit", "max_write_buffer"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        for name in ("read_timeout", "write_timeout", "slow_threshold", "close_timeout"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        # not NaN nor infinity either: they would stop the keepalive without a word
        if not (math.isfinite(self.ping_interval) and self.ping_interval >= 0):
            raise ValueError("ping_interval must be a number of seconds >= 0 (0: no pings)")
        if not (math.isfinite(self.pong_timeout) and self.pong_timeout > 0):
            raise ValueError("pong_timeout must be a number of seconds > 0")
        if self.handshake_timeout <= 0:
            raise ValueError("handshake_timeout must be > 0")
        if self.call_timeout_ms < 1:
            raise ValueError("call_timeout_ms must be >= 1")
        if self.max_subscriptions < 0:
            raise ValueError("max_subscriptions must be >= 0")
        if self.max_pending < 1:
            raise ValueError("max_pending must be >= 1")
        if self.max_concurrent_messages < 1:
            raise ValueError("max_concurrent_messages must be >= 1")
        if not (math.isfinite(self.fallback_grace) and self.fallback_grace >= 0):
            raise ValueError("fallback_grace must be a number of seconds >= 0")
        if self.fallback_replay < 0:
            raise ValueError("fallback_replay must be >= 0")
        if self.fallback_max_body < 1:
            raise ValueError("fallback_max_body must be >= 1")
        if not 0 <= self.compression_level <= 9 or self.compression_threshold < 0:
            raise ValueError("compression_level must be in 0..9 and compression_threshold >= 0")

    @property
    def listen(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, kw_only=True, slots=True)
class MetricsConfig:
    #: Prometheus endpoint port; 0 = none
    port: int = 0
    #: address the metrics endpoint listens on
    host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError("metrics port must be in 0..65535")


@dataclass(frozen=True, kw_only=True, slots=True)
class ApiConfig:
    """The server HTTP API (``juggler.api``): where it listens, its key, its limits."""

    #: address the API listens on
    host: str = "127.0.0.1"
    #: port the API listens on (0: any free port)
    port: int = 9001
    #: the key every request must carry (``Authorization: apikey KEY`` or ``X-API-Key: KEY``);
    #: visible ASCII, no spaces. Also ``--api-key`` or the ``JUGGLER_API_KEY`` environment variable
    key: str | None = None
    #: serve the API without a key: only where every client that can reach it is trusted
    insecure: bool = False
    #: max bytes of a request body (larger: 413)
    max_body: int = 1 << 20
    #: seconds a request waits for the other servers' answers (disconnect, unsubscribe, channels, info)
    survey_timeout: float = 3.0

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError("api port must be in 0..65535")
        if self.key is not None:
            if not self.key:
                raise ValueError("api key must not be empty")
            if not all(0x21 <= ord(c) <= 0x7E for c in self.key):
                raise ValueError("api key must be visible ASCII characters without spaces")
            if self.insecure:
                raise ValueError("api key and insecure exclude each other: drop one")
        if self.max_body < 2:
            raise ValueError("max_body must be >= 2")
        if self.survey_timeout <= 0:
            raise ValueError("survey_timeout must be > 0")

    def check_key(self) -> None:
        """ValueError unless a key is set or ``insecure`` is."""
        if self.key is None and not self.insecure:
            raise ValueError("the server API needs a key: --api-key KEY, the JUGGLER_API_KEY environment "
                             "variable or key in [api]; or --api-insecure to serve it without one "
                             "(only where every client is trusted)")

    @property
    def listen(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, kw_only=True, slots=True)
class AppConfig:
    """Everything ``juggler server`` runs with."""

    server: ServerConfig = field(default_factory=ServerConfig)
    #: the Redis broker's options (juggler.broker.redis.RedisBrokerConfig); None = in-memory broker
    redis: Any = None
    #: a separate Redis (or cluster) for pub-sub (RedisBrokerConfig); None = the RPC broker's
    pubsub: Any = None
    #: authentication and authorization (juggler.auth.AuthConfig)
    auth: Any = None
    memory: MemoryBrokerConfig = field(default_factory=MemoryBrokerConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    #: the server HTTP API (``[api]``); None = not served
    api: ApiConfig | None = None
    #: per-channel history, presence and join/leave options (``[[channels]]`` tables)
    channels: ChannelRules = field(default_factory=ChannelRules)
    #: the application's backend endpoints (``[[proxy]]`` tables, juggler.proxy.ProxyConfig)
    proxy: tuple[Any, ...] = ()


def _build(cls: type, section: str, data: dict[str, Any]) -> Any:
    if not isinstance(data, dict):
        raise ValueError(f"[{section}] must be a table")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"unknown option(s) in [{section}]: {', '.join(unknown)}")
    data = check_fields(cls, data, section)
    try:
        return cls(**data)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"[{section}]: {exc}") from exc


def config_from_dict(data: dict[str, Any]) -> AppConfig:
    unknown = sorted(set(data) - {"server", "redis", "pubsub", "memory", "metrics", "auth", "channels", "api",
                                 "proxy"})
    if unknown:
        raise ValueError(f"unknown section(s): {', '.join(unknown)}")
    server = data.get("server", {})
    if not isinstance(server, dict):
        raise ValueError("[server] must be a table")
    server = dict(server)
    if "listen" in server:
        server["host"], server["port"] = parse_listen(server.pop("listen"))
    redis = None
    if "redis" in data:
        from juggler.broker.redis import RedisBrokerConfig

        redis = _build(RedisBrokerConfig, "redis", data["redis"])
    pubsub = None
    if "pubsub" in data:
        from juggler.broker.redis import RedisBrokerConfig

        pubsub = _build(RedisBrokerConfig, "pubsub", data["pubsub"])
    from juggler.auth import AuthConfig

    auth = _build(AuthConfig, "auth", data.get("auth", {}))
    api = None
    if "api" in data:
        table = data["api"]
        if not isinstance(table, dict):
            raise ValueError("[api] must be a table")
        table = dict(table)
        if "listen" in table:
            table["host"], table["port"] = parse_listen(table.pop("listen"))
        api = _build(ApiConfig, "api", table)
    return AppConfig(
        server=_build(ServerConfig, "server", server),
        redis=redis,
        pubsub=pubsub,
        auth=auth,
        memory=_build(MemoryBrokerConfig, "memory", data.get("memory", {})),
        metrics=_build(MetricsConfig, "metrics", data.get("metrics", {})),
        api=api,
        channels=ChannelRules.from_toml(data.get("channels", [])),
        proxy=_proxies(data.get("proxy", [])),
    )


def _proxies(data: Any) -> tuple[Any, ...]:
    from juggler.proxy.config import proxies_from_toml

    return proxies_from_toml(data)


def load_config(path: str) -> AppConfig:
    """Read a TOML file into an AppConfig; ValueError on any invalid option,
    naming the file and the line (``juggler.toml:12: [server] read_limit:
    expected an integer, got 'abc'``)."""
    text, data = read_toml(path)
    try:
        return config_from_dict(data)
    except ValueError as exc:
        raise ValueError(f"{_where(path, text, data, str(exc))}: {exc}") from exc


def _where(path: str, text: str, data: dict[str, Any], message: str) -> str:
    """``FILE:LINE`` of what `message` (from config_from_dict) is about:
    the section, then the key of it, that fails on its own."""
    import re

    from rustext.tomllines import key_lines, line_of

    def fails(doc: dict[str, Any]) -> bool:
        try:
            config_from_dict(doc)
        except (ValueError, TypeError):
            return True
        return False

    found: tuple[str | int, ...] = ()
    m = re.match(r"unknown section\(s\): ([^,\s]+)", message)
    if m:
        found = (m.group(1),)
    else:
        for section, table in data.items():
            if not fails({section: table}):
                continue
            found = (section,)
            if isinstance(table, dict):
                for key, value in table.items():
                    if fails({section: {key: value}}):
                        found = (section, key)
                        break
            elif isinstance(table, list):
                for i, item in enumerate(table):
                    if fails({section: [item]}):
                        found = (section, i)
                        break
            break
    line = line_of(key_lines(text), found) if found else None
    return f"{path}:{line}" if line else str(path)
