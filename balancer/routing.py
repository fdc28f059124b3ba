"""Typed configuration of routing: named backend pools, listeners, routes,
header rules, redirects and request ids (the TOML shapes are in
``docs/balancer.md``).

The classes validate what they can alone in ``__post_init__``; references
between them (a route's backend must exist) are checked by
:class:`balancer.config.BalancerConfig`, and the data plane reads the
dataclasses and compiles them into its routing table. Errors name the key
path (``listeners[1].routes[0].host``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from balancer.checks import U64_MAX
from balancer.compression import Compression, compression
from balancer.errorpages import MAX_PAGE, ErrorPage, content_type_of, read_page
from balancer.errors import BalancerConfigError
from balancer.ratelimit import RateLimit
from balancer.rewrite import Rewrite, check_regex
from rustext.fields import check_fields

_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_TEMPLATE = re.compile(r"%\[([^\]]*)\]")
_TEMPLATE_VALUES = ("req.id", "src")
#: the longest host name a route matches (RFC 1035)
MAX_HOST = 255
#: headers the balancer manages itself: rules may not set or delete them
RESERVED_HEADERS = frozenset(
    ("connection", "keep-alive", "transfer-encoding", "content-length", "te", "trailer", "upgrade", "host"))


def _strs(value: Any, where: str) -> tuple[str, ...]:
    """A string or a list of strings, as a tuple."""
    if isinstance(value, str):
        return (value,)
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise BalancerConfigError(f"{where} must be a string or a list of strings, got {value!r}")


def _header_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not _TOKEN.match(name):
        raise BalancerConfigError(f"{where}: invalid header name {name!r}")
    return name


def _header_value(value: Any, where: str) -> str:
    if not isinstance(value, str) or any((c < " " and c != "\t") or c == "\x7f" for c in value):
        raise BalancerConfigError(f"{where} must be a string without line breaks or control characters, "
                                  f"got {value!r}")
    for name in _TEMPLATE.findall(value):
        if name not in _TEMPLATE_VALUES:
            raise BalancerConfigError(
                f"{where}: unknown value %[{name}] (expected %[req.id] or %[src])")
    if "%[" in _TEMPLATE.sub("", value):
        raise BalancerConfigError(f"{where}: %[ without its closing ] in {value!r}")
    return value


def section(cls: type, data: Any, where: str) -> Any:
    """``cls(**data)`` with unknown keys and wrong types refused, naming ``where``."""
    if not isinstance(data, Mapping):
        raise BalancerConfigError(f"{where} must be a table")
    known = {f.name for f in fields(cls)}
    unknown = set(data) - {f.name for f in fields(cls) if not f.metadata.get("internal")}
    if unknown:
        raise BalancerConfigError(f"unknown key(s) in {where}: {', '.join(sorted(unknown))}")
    if "where" in known:
        data = {**data, "where": where}
    try:
        return cls(**check_fields(cls, data, where))
    except BalancerConfigError:
        raise
    except ValueError as exc:  # check_fields names the key already
        raise BalancerConfigError(str(exc)) from exc
    except TypeError as exc:
        raise BalancerConfigError(f"{where}: {exc}") from exc


@dataclass(frozen=True, kw_only=True)
class HeaderRules:
    """Header rules of a message: ``delete`` first, then ``set`` (replaces),
    then ``add`` (appends). Values may hold ``%[req.id]`` (the request id) and
    ``%[src]`` (the client's address)."""

    #: name → value: the header replaced (or added if absent)
    set: Mapping[str, str] = field(default_factory=dict)
    #: name → value: one more header of that name
    add: Mapping[str, str] = field(default_factory=dict)
    #: names removed
    delete: str | tuple[str, ...] = ()
    where: str = field(default="headers", repr=False, compare=False, metadata={"internal": True})

    def __post_init__(self) -> None:
        object.__setattr__(self, "delete", _strs(self.delete, f"{self.where}.delete"))
        for op in ("set", "add"):
            table = getattr(self, op)
            if not isinstance(table, Mapping):
                raise BalancerConfigError(f"{self.where}.{op} must be a table of name = \"value\"")
            for name, value in table.items():
                _header_name(name, f"{self.where}.{op}")
                _header_value(value, f"{self.where}.{op}.{name}")
                if name.lower() in RESERVED_HEADERS:
                    raise BalancerConfigError(f"{self.where}.{op}: {name} is managed by the balancer")
        for name in self.delete:
            _header_name(name, f"{self.where}.delete")
            if name.lower() in RESERVED_HEADERS:
                raise BalancerConfigError(f"{self.where}.delete: {name} is managed by the balancer")

    def __bool__(self) -> bool:
        return bool(self.set or self.add or self.delete)


@dataclass(frozen=True, kw_only=True)
class HeaderMatch:
    """A header condition: present (neither ``equals`` nor ``prefix``),
    equal to a value, or starting with one (values are case-sensitive)."""

    #: the header name (case-insensitive)
    name: str
    #: the value it must have
    equals: str | None = None
    #: what its value must start with
    prefix: str | None = None

    def __post_init__(self) -> None:
        _header_name(self.name, "header.name")
        if self.equals is not None and self.prefix is not None:
            raise BalancerConfigError(f"header {self.name}: give equals or prefix, not both")


@dataclass(frozen=True, kw_only=True)
class ClientCertMatch:
    """A condition on the client certificate verified at the TLS handshake
    (``tls.client_ca``), as HAProxy's ``ssl_c_used`` and ``ssl_c_s_dn``:
    ``verified = false`` holds when the client presented none (or the
    connection is not TLS); a subject test implies a verified certificate.
    The subject is its RFC 4514 string, ``CN=admin,O=Example,C=DE``."""

    #: whether a verified certificate must be present (``true``) or absent (``false``)
    verified: bool = True
    #: the subject DN it must have (RFC 4514, case-sensitive)
    subject: str | None = None
    #: what its subject DN must start with (``CN=admin,``)
    subject_prefix: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.verified, bool):
            raise BalancerConfigError(f"client_cert.verified: expected true or false, got {self.verified!r}")
        for name in ("subject", "subject_prefix"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, str) or not v):
                raise BalancerConfigError(f"client_cert.{name}: expected a non-empty string, got {v!r}")
        if self.subject is not None and self.subject_prefix is not None:
            raise BalancerConfigError("client_cert: give subject or subject_prefix, not both")
        if not self.verified and (self.subject is not None or self.subject_prefix is not None):
            raise BalancerConfigError("client_cert: a subject test needs verified = true")


@dataclass(frozen=True, kw_only=True)
class Redirect:
    """Answer with a redirect instead of forwarding: to ``location``, or to
    the same host and target over HTTPS (``scheme = "https"``)."""

    #: 301, 302, 303, 307 or 308
    code: int = 302
    #: the ``Location`` (fixed)
    location: str | None = None
    #: ``"https"``: the request's host (without its port) and target over HTTPS
    scheme: str | None = None
    #: with ``scheme``: the HTTPS port, if not 443
    port: int | None = None

    def __post_init__(self) -> None:
        if self.code not in (301, 302, 303, 307, 308):
            raise BalancerConfigError(f"redirect.code must be 301, 302, 303, 307 or 308, got {self.code!r}")
        if (self.location is None) == (self.scheme is None):
            raise BalancerConfigError('redirect needs location = "..." or scheme = "https" (one of them)')
        if self.scheme is not None and self.scheme != "https":
            raise BalancerConfigError(f'redirect.scheme must be "https", got {self.scheme!r}')
        if self.location is not None:
            _header_value(self.location, "redirect.location")
        if self.port is not None and (isinstance(self.port, bool) or not isinstance(self.port, int)
                                      or not 1 <= self.port <= 65535):
            raise BalancerConfigError(f"redirect.port must be in 1..65535, got {self.port!r}")


@dataclass(frozen=True, kw_only=True)
class Respond:
    """Answer the request here instead of forwarding it (HAProxy's ``http-request
    return`` and ``deny``, nginx's ``return``): a status and a body, given as
    text or read from a file (at load and on every reload)."""

    #: the status answered, 200..599: ``403`` to deny, ``200`` for a fixed answer
    status: int = 200
    #: the body, as text; with neither ``body`` nor ``file`` the ``[error_pages]`` page of the
    #: status is answered if there is one (HAProxy's ``deny``), else an empty body
    body: str | None = None
    #: or the file the body is read from (at most 64 KiB)
    file: str | None = None
    #: its ``Content-Type``; by default ``text/plain; charset=utf-8`` for ``body``, told by the
    #: extension for ``file``
    content_type: str | None = None
    #: what ``file`` held when read
    file_bytes: bytes = field(default=b"", repr=False, compare=False, metadata={"internal": True})
    where: str = field(default="respond", repr=False, compare=False, metadata={"internal": True})

    def __post_init__(self) -> None:
        w = self.where
        if isinstance(self.status, bool) or not isinstance(self.status, int) or not 200 <= self.status <= 599:
            raise BalancerConfigError(f"{w}.status must be an HTTP status in 200..599, got {self.status!r}")
        if self.body is not None and self.file is not None:
            raise BalancerConfigError(f"{w}: give body or file, not both")
        if self.body is not None and not isinstance(self.body, str):
            raise BalancerConfigError(f"{w}.body must be a string")
        if self.body is not None and len(self.body.encode()) > MAX_PAGE:
            raise BalancerConfigError(f"{w}.body is over {MAX_PAGE // 1024} KiB")
        if self.content_type is not None:
            _header_value(self.content_type, f"{w}.content_type")
        if self.file is not None:
            object.__setattr__(self, "file_bytes", read_page(self.file, f"{w}.file"))

    @property
    def page(self) -> ErrorPage:
        """The answer made: ``status``, its ``Content-Type`` and the body."""
        if self.file is not None:
            body = self.file_bytes
            content_type = self.content_type or content_type_of(self.file)
        else:
            body = (self.body or "").encode()
            content_type = self.content_type or "text/plain; charset=utf-8"
        return ErrorPage(self.status, (("Content-Type", content_type),), body)


@dataclass(frozen=True, kw_only=True)
class Route:
    """A route (``[[routes]]`` or ``[[listeners.routes]]``): all of its
    conditions must hold; routes are tried in order, the first that holds
    wins. No condition at all matches every request."""

    #: host names (case-insensitive, port and a trailing dot ignored); ``*.example.com`` matches its subdomains
    host: str | tuple[str, ...] = ()
    #: exact paths (the target before ``?``, not decoded)
    path: str | tuple[str, ...] = ()
    #: path prefixes (any of ``path`` or ``path_prefix`` matching is enough)
    path_prefix: str | tuple[str, ...] = ()
    #: methods (upper case)
    method: str | tuple[str, ...] = ()
    #: header conditions (``{ name = "X-Canary", equals = "1" }``), all must hold
    header: HeaderMatch | tuple[HeaderMatch, ...] = ()
    #: a condition on the verified client certificate (``{ subject_prefix = "CN=admin," }``,
    #: ``{ verified = false }``)
    client_cert: ClientCertMatch | None = None
    #: a regular expression the path (before ``?``, not decoded) must match; searched
    #: anywhere unless anchored (``'^/api/v\d+/'``), as HAProxy's ``path_reg``
    path_regex: str | None = None
    #: a regular expression the host must match, case-insensitive, against the host
    #: without its port or a trailing dot (``'^(www|api)\.example\.com$'``)
    host_regex: str | None = None
    #: the backend pool (a ``[backends.NAME]`` name, or ``default`` with a ``[[backends]]`` list)
    backend: str | None = None
    #: answer with a redirect instead (``{ code = 301, location = "..." }`` or ``{ scheme = "https" }``)
    redirect: Redirect | None = None
    #: or answer here (``{ status = 403 }``, ``{ status = 200, body = "ok" }``, ``{ file = "..." }``)
    respond: Respond | None = None
    #: header rules on the request sent to the backend
    request_headers: HeaderRules = field(default_factory=HeaderRules)
    #: header rules on the response sent to the client
    response_headers: HeaderRules = field(default_factory=HeaderRules)
    #: how the forwarded target changes (``{ strip_prefix = "/api" }``,
    #: ``{ replace_path = { regex = '^/u/(\d+)$', replacement = '/users/$1' } }``, ``{ set_query = "v=2" }``)
    rewrite: Rewrite | None = None
    #: a rate limit of this route's own (nginx's ``limit_req`` in a ``location``): the requests it
    #: takes count there, in a table of their own, besides the top-level and the pool's limits
    rate_limit: RateLimit | None = None
    #: response compression of this route (``true``, ``false`` or a table as the listener's);
    #: unset: the listener's
    compress: Compression | bool | None = None
    where: str = field(default="route", repr=False, compare=False, metadata={"internal": True})

    def __post_init__(self) -> None:
        w = self.where
        for name in ("host", "path", "path_prefix", "method"):
            object.__setattr__(self, name, _strs(getattr(self, name), f"{w}.{name}"))
        for h in self.host:
            bare = h.lower().rstrip(".")
            if not bare or " " in bare or "/" in bare or len(bare) > MAX_HOST or ("*" in bare and not (
                    bare.startswith("*.") and "*" not in bare[2:] and len(bare) > 2)):
                raise BalancerConfigError(f"{w}.host: invalid host {h!r} (a name, or *.example.com)")
        for p in self.path + self.path_prefix:
            if not p.startswith("/"):
                raise BalancerConfigError(f"{w}: path {p!r} must start with /")
        for m in self.method:
            if not (m.isascii() and m.isalpha()):
                raise BalancerConfigError(f"{w}.method: invalid method {m!r}")
        object.__setattr__(self, "method", tuple(m.upper() for m in self.method))  # as requests carry them
        header = self.header
        if isinstance(header, Mapping):
            header = (header,)
        object.__setattr__(self, "header", tuple(
            h if isinstance(h, HeaderMatch) else section(HeaderMatch, h, f"{w}.header[{i}]")
            for i, h in enumerate(header)))
        if isinstance(self.client_cert, Mapping):
            object.__setattr__(self, "client_cert", section(ClientCertMatch, self.client_cert, f"{w}.client_cert"))
        if isinstance(self.redirect, Mapping):
            object.__setattr__(self, "redirect", section(Redirect, self.redirect, f"{w}.redirect"))
        if isinstance(self.respond, Mapping):
            object.__setattr__(self, "respond", section(Respond, self.respond, f"{w}.respond"))
        for name in ("request_headers", "response_headers"):
            v = getattr(self, name)
            if isinstance(v, Mapping):
                object.__setattr__(self, name, section(HeaderRules, v, f"{w}.{name}"))
        for name in ("path_regex", "host_regex"):
            if getattr(self, name) is not None:
                check_regex(getattr(self, name), f"{w}.{name}")
        if isinstance(self.rewrite, Mapping):
            object.__setattr__(self, "rewrite", section(Rewrite, self.rewrite, f"{w}.rewrite"))
        if isinstance(self.rate_limit, Mapping):
            try:
                limit = section(RateLimit, self.rate_limit, f"{w}.rate_limit")
            except BalancerConfigError as exc:  # its messages start with "rate_limit."
                raise BalancerConfigError(f"{w}.{exc}" if str(exc).startswith("rate_limit.") else str(exc)) from exc
            object.__setattr__(self, "rate_limit", limit)
        _tables(self, w, client_cert=ClientCertMatch, redirect=Redirect, respond=Respond, rate_limit=RateLimit, request_headers=HeaderRules,
                response_headers=HeaderRules, rewrite=Rewrite)
        object.__setattr__(self, "compress", compression(self.compress, f"{w}.compress"))
        if sum(x is not None for x in (self.backend, self.redirect, self.respond)) != 1:
            raise BalancerConfigError(f"{w}: a route needs a backend, a redirect or respond (one of them)")
        if self.rewrite and self.backend is None:
            raise BalancerConfigError(f"{w}.rewrite: a rewrite needs a backend (it changes what is forwarded)")


@dataclass(frozen=True, kw_only=True)
class Hsts:
    """``Strict-Transport-Security`` on every response of an HTTPS listener."""

    #: seconds browsers remember to use HTTPS
    max_age: int = 31_536_000
    #: ``includeSubDomains``: the subdomains too
    include_subdomains: bool = False
    #: ``preload``: ask to be in the browsers' preload lists
    preload: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.max_age, bool) or not isinstance(self.max_age, int) or not 0 <= self.max_age <= U64_MAX:
            raise BalancerConfigError(f"hsts.max_age must be an integer >= 0, got {self.max_age!r}")


@dataclass(frozen=True, kw_only=True)
class RequestId:
    """Request ids: an incoming one (1 to 200 visible ASCII characters, the
    header given once) is kept, else one is generated (32 hex digits); it is
    forwarded to the backend and echoed in the response."""

    #: the header carrying it
    header: str = "X-Request-ID"

    def __post_init__(self) -> None:
        _header_name(self.header, "request_id.header")
        if self.header.lower() in RESERVED_HEADERS:
            raise BalancerConfigError(f"request_id.header: {self.header} cannot carry a request id")


@dataclass(frozen=True, kw_only=True)
class Listener:
    """One listener (``[[listeners]]``), with its own routes."""

    #: ``host:port`` clients connect to, or ``unix:/path``; a reload opens new listeners and closes those no longer listed
    address: str
    #: HTTPS, with the certificates of ``[tls]``
    tls: bool = False
    #: the routes (``[[listeners.routes]]``), tried in order
    routes: tuple[Route, ...] = ()
    #: the backend pool of requests no route takes; unset: they get ``503``
    default_backend: str | None = None
    #: request ids (``{ header = "X-Request-ID" }``); unset: none
    request_id: RequestId | None = None
    #: HSTS on responses (HTTPS listeners; ``{ max_age = 31536000, include_subdomains = true }``)
    hsts: Hsts | None = None
    #: header rules on every request forwarded from this listener (before the backend's and the route's)
    request_headers: HeaderRules = field(default_factory=HeaderRules)
    #: header rules on every response from a backend
    response_headers: HeaderRules = field(default_factory=HeaderRules)
    #: this listener's own access log (a table as ``[access_log]``), or ``false`` for none; unset:
    #: the ``[access_log]`` table's
    access_log: Any = None
    where: str = field(default="listener", repr=False, compare=False, metadata={"internal": True})
    #: connections start with a PROXY protocol header (v1 or v2, as HAProxy's ``accept-proxy``) giving
    #: the client's address; a connection without a valid one within ``timeouts.header`` is closed
    accept_proxy: bool = False
    #: permissions of a unix socket listener's file (``"0660"``); unset: as the umask leaves them
    mode: str | None = None
    #: response compression (``true`` for the defaults, or a ``[listeners.compress]`` table); routes
    #: may override it; unset: none
    compress: Compression | bool | None = None
    #: client certificates on this HTTPS listener (with ``tls.client_ca``): ``"required"``,
    #: ``"optional"`` or ``"off"`` (none asked); unset: ``tls.client_verify``
    client_verify: str | None = None
    #: with ``tls``: HTTP/3 over QUIC as well, on the same port over UDP, advertised to HTTP/1.1 and
    #: HTTP/2 clients by ``Alt-Svc``; ``false``: HTTPS over TCP only (a listener that stays keeps it)
    http3: bool = True

    def __post_init__(self) -> None:
        from balancer.checks import parse_hostport

        w = self.where
        from balancer.checks import check_unix_path, unix_path

        if (path := unix_path(self.address)) is not None:
            check_unix_path(path, f"{w}.address")
        else:
            parse_hostport(self.address, f"{w}.address")
            if self.mode is not None:
                raise BalancerConfigError(f"{w}.mode applies to a unix socket listener (address = \"unix:/path\")")
        if self.mode is not None and (not isinstance(self.mode, str) or not re.fullmatch(r"0?[0-7]{3}", self.mode)):
            raise BalancerConfigError(f"{w}.mode must be octal permissions such as \"0660\", got {self.mode!r}")
        if not isinstance(self.accept_proxy, bool):
            raise BalancerConfigError(f"{w}.accept_proxy must be true or false, got {self.accept_proxy!r}")
        if not isinstance(self.http3, bool):
            raise BalancerConfigError(f"{w}.http3 must be true or false, got {self.http3!r}")
        object.__setattr__(self, "routes", tuple(
            r if isinstance(r, Route) else section(Route, r, f"{w}.routes[{i}]")
            if isinstance(r, Mapping) else _bad(f"{w}.routes[{i}]")
            for i, r in enumerate(self.routes)))
        if isinstance(self.request_id, Mapping):
            object.__setattr__(self, "request_id", section(RequestId, self.request_id, f"{w}.request_id"))
        if isinstance(self.hsts, Mapping):
            object.__setattr__(self, "hsts", section(Hsts, self.hsts, f"{w}.hsts"))
        if self.hsts is not None and not self.tls:
            raise BalancerConfigError(f"{w}.hsts needs an HTTPS listener (tls = true)")
        if self.client_verify is not None:
            if self.client_verify not in ("required", "optional", "off"):
                raise BalancerConfigError(
                    f"{w}.client_verify: expected \"required\", \"optional\" or \"off\", got {self.client_verify!r}")
            if not self.tls:
                raise BalancerConfigError(f"{w}.client_verify needs an HTTPS listener (tls = true)")
        for name in ("request_headers", "response_headers"):
            v = getattr(self, name)
            if isinstance(v, Mapping):
                object.__setattr__(self, name, section(HeaderRules, v, f"{w}.{name}"))
        _tables(self, w, request_id=RequestId, hsts=Hsts, request_headers=HeaderRules, response_headers=HeaderRules)
        object.__setattr__(self, "compress", compression(self.compress, f"{w}.compress"))
        from balancer.accesslog import AccessLog

        if isinstance(self.access_log, Mapping):
            object.__setattr__(self, "access_log", section(AccessLog, self.access_log, f"{w}.access_log"))
        elif self.access_log is True:
            object.__setattr__(self, "access_log", None)
        elif self.access_log is not None and self.access_log is not False and not isinstance(self.access_log, AccessLog):
            raise BalancerConfigError(f"{w}.access_log must be a table (as [access_log]) or false")

    def backends_used(self) -> list[tuple[str, str]]:
        """(key path, backend name) of every reference to a pool."""
        at = f"{self.where}." if self.where else ""  # "": the top-level keys of ``listen``
        out = [(f"{at}routes[{i}].backend", r.backend) for i, r in enumerate(self.routes) if r.backend]
        if self.default_backend:
            out.append((f"{at}default_backend", self.default_backend))
        return out


def _bad(where: str) -> Any:
    raise BalancerConfigError(f"{where} must be a table")


def _tables(obj: object, where: str, **classes: type) -> None:
    """Refuse a value of these keys that did not become its table's class (``rate_limit = []``)."""
    for name, cls in classes.items():
        value = getattr(obj, name)
        if value is not None and not isinstance(value, cls):
            _bad(f"{where}.{name}")


@dataclass(frozen=True, kw_only=True)
class NamedBackend:
    """A named backend pool (``[backends.NAME]``): its servers and policy.
    Keys left out take the top-level value (``algorithm``, ``retries``,
    ``[timeouts]``, ``[passive]``, ``[limits]`` ``max_connections``, ``[health]``)."""

    #: the servers: ``"host:port"`` strings or ``{ address, weight, max_connections }`` tables
    servers: tuple[Any, ...] = ()
    #: as the top-level key; unset: the top-level value
    algorithm: str | None = None
    #: as the top-level key; unset: the top-level value
    hash_key: str | None = None
    #: as the top-level key; unset: the top-level value
    retries: int | None = None
    #: concurrent requests per server (0 = unlimited); unset: ``limits.max_connections``
    max_connections: int | None = None
    #: a ``[timeouts]`` table for this pool (keys left out: the top-level ones)
    timeouts: Mapping[str, Any] | None = None
    #: a ``[passive]`` table for this pool
    passive: Mapping[str, Any] | None = None
    #: a ``[health]`` table for this pool (``enabled = false``: none); unset: the top-level one
    health: Mapping[str, Any] | None = None
    #: header rules on requests sent to this pool (after the listener's, before the route's)
    request_headers: HeaderRules = field(default_factory=HeaderRules)
    #: header rules on its responses
    response_headers: HeaderRules = field(default_factory=HeaderRules)
    where: str = field(default="backends", repr=False, compare=False, metadata={"internal": True})
    #: set once DNS expanded ``servers`` into addresses: an empty list is then "no address yet"
    discovered: bool = field(default=False, repr=False, compare=False, metadata={"internal": True})
    #: as the top-level key (``"v1"``, ``"v2"`` or ``"none"``); unset: the top-level value
    send_proxy: str | None = None
    #: as the top-level key; unset: the top-level value
    all_backups: bool | None = None
    #: as the top-level key (``"30s"``); unset: the top-level value
    slow_start: float | str | None = None
    #: as the top-level key; unset: the top-level value
    retry_on: tuple[str, ...] | None = None
    #: a ``[backends.NAME.sticky]`` table (cookie persistence for this pool); ``false``: none; unset:
    #: the top-level ``[sticky]``
    sticky: Mapping[str, Any] | bool | None = None
    #: ``h1`` or ``h2``, as the top-level key; unset: the top-level value
    proto: str | None = None
    #: as the top-level key; unset: the top-level value
    h2_max_streams: int | None = None
    #: as the top-level key; unset: the top-level value
    h2_connections: int | None = None
    #: a ``[backends.NAME.rate_limit]`` table: a rate limit of this pool's own, checked after routing
    #: (the top-level ``[rate_limit]`` applies first, to every request)
    rate_limit: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        from balancer.checks import check_send_proxy

        check_send_proxy(self.send_proxy, f"{self.where}.send_proxy")
        for name in ("request_headers", "response_headers"):
            v = getattr(self, name)
            if isinstance(v, Mapping):
                w = f"{self.where}.{name}"
                object.__setattr__(self, name, section(HeaderRules, v, w))
        if self.proto is not None and self.proto not in ("h1", "h2"):
            raise BalancerConfigError(f'{self.where}.proto must be "h1" or "h2", got {self.proto!r}')
        from balancer.checks import check_h2_limits

        check_h2_limits(self.h2_max_streams, self.h2_connections, f"{self.where}.")
