"""The tables of the balancer's file that each validate on their own:
``[timeouts]``, ``[passive]``, ``[limits]``, ``[health]`` and ``[tls]``.

Apart from :mod:`balancer.config` (which re-exports them) so that it holds the
whole configuration, its backends and pools, and the loader; these need
nothing of it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from balancer.checks import U32_MAX, U64_MAX, check_count, check_seconds, parse_hostport
from balancer.errors import BalancerConfigError
from balancer.policies import LAYER7_ERRORS
from balancer.routing import section

_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")


def _non_negative(obj: object, *names: str) -> None:
    for name in names:
        v = getattr(obj, name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise BalancerConfigError(f"{type(obj).__name__}.{name} must be a number >= 0, got {v!r}")


def _seconds(obj: object, table: str, *names: str) -> None:
    """Durations the data plane takes (finite, at most one year), after :func:`_non_negative`."""
    for name in names:
        check_seconds(getattr(obj, name), f"{table}.{name}")


def _counts(obj: object, table: str, *names: str, top: int = U64_MAX) -> None:
    """Integer fields in the range of the data plane's (after :func:`_non_negative`)."""
    for name in names:
        check_count(getattr(obj, name), f"{table}.{name}", top)


@dataclass(frozen=True, kw_only=True)
class Timeouts:
    """Seconds; a backend timeout answers ``504``."""

    #: to connect to a backend (then the next backend is tried)
    connect: float = 3.0
    #: from the first byte of a request head to its end; the connection is cut (slowloris guard)
    header: float = 10.0
    #: for the backend's response head, counted from the last request-body progress → ``504``
    response: float = 30.0
    #: an idle keep-alive client connection is closed after ``idle`` to 1.5 × ``idle``
    idle: float = 60.0
    #: the whole exchange, body included; 0 = none (an expired body is cut)
    total: float = 0.0
    #: wait for a backend slot when its ``max_connections`` is reached, then ``503``
    queue: float = 5.0
    #: an upgraded connection (WebSocket) with nothing moving either way for this long is closed;
    #: 0 = never. Unset: as HAProxy without ``timeout tunnel``, the client and backend timeouts go on
    #: applying (the smaller of ``idle`` and ``response``)
    tunnel: float | None = field(default=None, metadata={"default": "the smaller of idle and response"})

    def __post_init__(self) -> None:
        _non_negative(self, "connect", "header", "response", "idle", "total", "queue")
        _seconds(self, "timeouts", "connect", "header", "response", "idle", "total", "queue")
        if self.tunnel is not None:
            _non_negative(self, "tunnel")
            _seconds(self, "timeouts", "tunnel")
        if self.connect == 0 or self.response == 0:
            raise BalancerConfigError("timeouts.connect and timeouts.response must be > 0")

    @property
    def tunnel_effective(self) -> float:
        """The tunnel inactivity timeout in force (0: none)."""
        if self.tunnel is not None:
            return self.tunnel
        return min((t for t in (self.idle, self.response) if t > 0), default=0.0)


@dataclass(frozen=True, kw_only=True)
class Passive:
    """Passive health: backends that keep failing are ejected for a while."""

    #: consecutive transport failures that eject a backend; 0 = never
    eject_after: int = 3
    #: seconds an ejected backend stays out
    cooldown: float = 10.0
    #: what counts as a failure: ``"layer4"`` (connections: refused, reset, timed out) or ``"layer7"``
    #: (those and responses with one of ``error_statuses``), as HAProxy's ``observe``
    observe: str = "layer4"
    #: with ``observe = "layer7"``: the statuses that count as failures
    error_statuses: tuple[int, ...] = field(default=LAYER7_ERRORS, metadata={"default": "every 5xx but 501 and 505"})
    #: what ``eject_after`` failures do: ``"eject"`` (out for ``cooldown``) or ``"mark-down"`` (out until
    #: the pool's active health check passes ``rise`` times, as HAProxy's ``on-error mark-down``)
    on_error: str = "eject"

    def __post_init__(self) -> None:
        _non_negative(self, "eject_after", "cooldown")
        _counts(self, "passive", "eject_after", top=U32_MAX)
        _seconds(self, "passive", "cooldown")
        if self.observe not in ("layer4", "layer7"):
            raise BalancerConfigError(f"passive.observe must be \"layer4\" or \"layer7\", got {self.observe!r}")
        if self.on_error not in ("eject", "mark-down"):
            raise BalancerConfigError(f"passive.on_error must be \"eject\" or \"mark-down\", got {self.on_error!r}")
        statuses = tuple(self.error_statuses)
        if not all(isinstance(x, int) and not isinstance(x, bool) and 100 <= x <= 599 for x in statuses):
            raise BalancerConfigError(f"passive.error_statuses must be HTTP statuses, got {self.error_statuses!r}")
        object.__setattr__(self, "error_statuses", statuses)

    @property
    def eject_until_checked(self) -> bool:
        """Whether an ejection lasts until the active health check passes (``mark-down``)
        rather than ``cooldown``."""
        return self.on_error == "mark-down"


@dataclass(frozen=True, kw_only=True)
class Limits:
    """Bounds on requests and on the backend connection pools."""

    #: concurrent requests per backend (more wait up to ``timeouts.queue``); 0 = unlimited
    max_connections: int = 0
    #: client connections open at once from one client address; more are closed at accept
    #: (a restart applies a change); 0 = unlimited
    max_client_connections: int = 0
    #: client connections open at once over every listener (HAProxy's ``maxconn``): at the limit
    #: the listeners stop accepting, and new connections wait in the kernel's accept queue until
    #: one closes (a restart applies a change); 0 = unlimited
    max_open_connections: int = 0
    #: largest request head, at least 8192 (larger: ``431``)
    max_header_bytes: int = 65536
    #: idle keep-alive connections kept per backend and per worker
    pool_max_idle: int = 64
    #: seconds an idle backend connection is kept
    pool_idle_timeout: float = 60.0

    def __post_init__(self) -> None:
        _non_negative(self, "max_connections", "pool_max_idle", "pool_idle_timeout", "max_client_connections",
                      "max_open_connections")
        _counts(self, "limits", "max_connections", "pool_max_idle", "max_client_connections", "max_open_connections",
                "max_header_bytes")
        _seconds(self, "limits", "pool_idle_timeout")
        if self.max_header_bytes < 8192:
            raise BalancerConfigError(f"limits.max_header_bytes must be >= 8192, got {self.max_header_bytes}")


@dataclass(frozen=True, kw_only=True)
class HealthCheck:
    """Active health checks of every backend: ``GET path`` (2xx or 3xx is
    up), over HTTP/2 for ``proto = "h2"`` pools; or the gRPC health checking
    protocol (``grpc.health.v1.Health/Check``; ``SERVING`` is up)."""

    #: false: no active checks
    enabled: bool = True
    #: ``"http"``: ``GET path``; ``"grpc"``: the gRPC health checking protocol (needs ``proto = "h2"``)
    type: str = "http"
    #: the path requested (HTTP checks only)
    path: str = "/"
    #: the method of HTTP checks: ``GET``, ``HEAD`` or ``OPTIONS`` (HAProxy's ``http-check send meth``)
    method: str = "GET"
    #: the service a gRPC check asks about (``HealthCheckRequest.service``); empty = the whole server
    grpc_service: str = ""
    #: seconds between checks of one backend
    interval: float = 2.0
    #: seconds one check may take
    timeout: float = 1.0
    rise: int = 2  # consecutive successes to mark a backend up
    fall: int = 3  # consecutive failures to mark it down
    host: str | None = None  # Host header (:authority of HTTP/2 and gRPC checks; default: the backend address)
    #: check this port of each server instead of the one it serves on (HAProxy's ``check port``,
    #: a management port); not for servers on a Unix socket
    port: int | None = None
    #: HTTP checks: the statuses that count as up, e.g. ``[200]`` (HAProxy's ``http-check expect
    #: status``); unset: any 2xx or 3xx
    expect_status: tuple[int, ...] | None = None
    #: HTTP checks: text the response body must contain (HAProxy's ``http-check expect string``),
    #: looked for in its first 64 KiB
    expect_body: str | None = None

    def __post_init__(self) -> None:
        _non_negative(self, "interval", "timeout")
        if self.port is not None and (isinstance(self.port, bool) or not isinstance(self.port, int)
                                      or not 1 <= self.port <= 65535):
            raise BalancerConfigError(f"health.port must be a port number (1..65535), got {self.port!r}")
        if self.expect_status is not None:
            statuses = self.expect_status
            if isinstance(statuses, int) and not isinstance(statuses, bool):
                statuses = (statuses,)
            if not isinstance(statuses, (list, tuple)) or not statuses or not all(
                    isinstance(c, int) and not isinstance(c, bool) and 100 <= c <= 599 for c in statuses):
                raise BalancerConfigError(
                    f"health.expect_status must be a list of HTTP statuses (100..599), got {self.expect_status!r}")
            object.__setattr__(self, "expect_status", tuple(statuses))
        if self.expect_body is not None and (not isinstance(self.expect_body, str) or not self.expect_body
                                             or len(self.expect_body) > 1024):
            raise BalancerConfigError(
                f"health.expect_body must be a text of 1 to 1024 characters, got {self.expect_body!r}")
        if self.method not in ("GET", "HEAD", "OPTIONS"):
            raise BalancerConfigError(f"health.method must be GET, HEAD or OPTIONS, got {self.method!r}")
        if self.method == "HEAD" and self.expect_body is not None:
            raise BalancerConfigError("health.expect_body needs a method whose answer has a body (not HEAD)")
        if self.type == "grpc" and (self.expect_status is not None or self.expect_body is not None):
            raise BalancerConfigError(
                "health.expect_status and health.expect_body are for HTTP checks: a gRPC check expects SERVING")
        if self.type not in HEALTH_TYPES:
            raise BalancerConfigError(f"health.type must be \"http\" or \"grpc\", got {self.type!r}")
        if not self.path.startswith("/"):
            raise BalancerConfigError(f"health.path must start with '/', got {self.path!r}")
        if self.type == "grpc" and self.path != "/":
            raise BalancerConfigError(
                "health.path is for HTTP checks: a gRPC check asks grpc.health.v1.Health/Check "
                "about grpc_service instead")
        if self.type == "grpc" and self.method != "GET":
            raise BalancerConfigError("health.method is for HTTP checks: a gRPC check is a POST of its own")
        if self.type == "http" and self.grpc_service:
            raise BalancerConfigError("health.grpc_service needs type = \"grpc\"")
        if self.interval <= 0 or self.timeout <= 0:
            raise BalancerConfigError("health.interval and health.timeout must be > 0")
        if self.rise < 1 or self.fall < 1:
            raise BalancerConfigError("health.rise and health.fall must be >= 1")


#: what ``[health] type`` takes
HEALTH_TYPES = ("http", "grpc")


@dataclass(frozen=True, kw_only=True)
class Certificate:
    """One certificate of the listener (``[[tls.certificates]]``): picked
    for clients asking for a name it lists (SNI); the first is the default."""

    #: PEM certificate chain, the server's certificate first
    cert: str
    #: PEM private key (ECDSA or RSA) of ``cert``
    key: str
    #: obtained by ACME (``[acme]``): the files may not exist until the balancer starts
    managed: bool = field(default=False, repr=False, metadata={"internal": True})


@dataclass(frozen=True, kw_only=True)
class ClientCertHeaders:
    """Request headers that pass the client certificate verified at the
    handshake to backends; each unset is not sent. Fields of these names
    coming from clients are always removed first, on every listener."""

    #: the subject DN as an RFC 4514 string, most specific first (``CN=alice,O=Example,C=DE``)
    subject: str | None = None
    #: the lower-case hex SHA-256 of the certificate (DER)
    fingerprint: str | None = None
    #: ``SUCCESS`` when a verified certificate was presented (absent otherwise)
    verified: str | None = None
    #: the serial number, upper-case hex of its bytes as encoded
    serial: str | None = None
    #: the subjectAltName entries, ``DNS:a.example, email:a@example.com, URI:..., IP:192.0.2.1``
    san: str | None = None

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for f in ("subject", "fingerprint", "verified", "serial", "san"):
            v = getattr(self, f)
            if v is None:
                continue
            if not isinstance(v, str) or not _TOKEN.fullmatch(v):
                raise BalancerConfigError(f"tls.client_cert_headers.{f}: invalid header name {v!r}")
            if v.lower() in seen:
                raise BalancerConfigError(f"tls.client_cert_headers.{f}: {v} is named twice")
            seen.add(v.lower())

    def names(self) -> tuple[str, ...]:
        """The header names configured."""
        return tuple(v for v in (self.subject, self.fingerprint, self.verified, self.serial, self.san) if v)


@dataclass(frozen=True, kw_only=True)
class Tls:
    """HTTPS termination (the ``[tls]`` table): TLS 1.2 and 1.3, ALPN h2 and
    http/1.1, certificates by SNI, reloaded on SIGHUP; TLS to backends."""

    #: the listener's certificates (``[[tls.certificates]]`` tables); none = plain HTTP
    certificates: tuple[Certificate, ...] = ()
    #: require client certificates signed by this PEM CA (mutual TLS); unset = none asked
    client_ca: str | None = None
    #: with ``client_ca``: ``"required"`` (a client without a valid certificate is refused at the
    #: handshake) or ``"optional"`` (a client may present none; one it presents must be valid)
    client_verify: str = "required"
    #: with ``client_ca``: PEM certificate revocation lists, one for each CA of a client's chain
    #: (HAProxy's ``crl-file``); a revoked certificate, or one from a CA without a list here, is refused
    client_crl: str | None = None
    #: request headers passing the verified client certificate to backends (HAProxy's ``ssl_c_*``)
    client_cert_headers: ClientCertHeaders = field(default_factory=ClientCertHeaders)
    #: ``host:port`` of a plain-HTTP listener answering every request with a 308 redirect to HTTPS
    redirect: str | None = None
    #: speak TLS to the backends (verified against ``backend_ca`` or the system's trust store)
    backend: bool = False
    #: PEM CA to verify backends with
    backend_ca: str | None = None
    #: do not verify backends at all (only for trying things out)
    backend_insecure: bool = False
    #: ``"auto"``: staple the OCSP status of each certificate naming a responder (refreshed
    #: half-way through each response's validity); ``"off"``: never ask
    ocsp_stapling: str = "auto"

    def __post_init__(self) -> None:
        object.__setattr__(self, "certificates", tuple(
            c if isinstance(c, Certificate) else Certificate(**c) for c in self.certificates))
        if self.redirect is not None:
            parse_hostport(self.redirect, "tls.redirect")
            if not self.certificates:
                raise BalancerConfigError("tls.redirect needs certificates: the listener must serve HTTPS")
        if self.client_ca is not None and not self.certificates:
            raise BalancerConfigError("tls.client_ca needs certificates on the listener")
        if self.client_crl is not None and self.client_ca is None:
            raise BalancerConfigError("tls.client_crl needs tls.client_ca (client certificates)")
        if self.client_verify not in ("required", "optional"):
            raise BalancerConfigError(
                f"tls.client_verify: expected \"required\" or \"optional\", got {self.client_verify!r}")
        if isinstance(self.client_cert_headers, Mapping):
            object.__setattr__(self, "client_cert_headers", section(
                ClientCertHeaders, self.client_cert_headers, "tls.client_cert_headers"))
        if not isinstance(self.client_cert_headers, ClientCertHeaders):
            raise BalancerConfigError("tls.client_cert_headers: expected a table")
        if self.client_cert_headers.names() and self.client_ca is None:
            raise BalancerConfigError("tls.client_cert_headers needs tls.client_ca (client certificates)")
        if self.ocsp_stapling not in ("auto", "off"):
            raise BalancerConfigError(
                f"tls.ocsp_stapling: expected \"auto\" or \"off\", got {self.ocsp_stapling!r}")
        if (self.backend_ca is not None or self.backend_insecure) and not self.backend:
            raise BalancerConfigError("tls.backend_ca and tls.backend_insecure need tls.backend = true")
        for path in [p for c in self.certificates if not c.managed for p in (c.cert, c.key)] + [
                p for p in (self.client_ca, self.client_crl, self.backend_ca) if p]:
            if not os.path.isfile(path):
                raise BalancerConfigError(f"TLS file {path}: no such file")
