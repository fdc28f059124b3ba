"""``[[proxy]]`` tables: which of the application's endpoints answers what.

::

    [[proxy]]
    kind = "connect"                       # connect | refresh | subscribe | publish | rpc
    endpoint = "http://127.0.0.1:8000/juggler/connect"   # or "grpc://127.0.0.1:50051"
    timeout = 1.0
    headers = ["Authorization", "X-Request-Id"]
    cookies = ["sessionid"]

    [[proxy]]
    kind = "subscribe"
    endpoint = "http://127.0.0.1:8000/juggler/subscribe"
    match = ["chat:*"]                     # channel globs; the first matching proxy decides

One ``connect`` and one ``refresh`` proxy at most; ``subscribe``,
``publish`` and ``rpc`` proxies each need ``match`` (channel globs, or URI
globs for ``rpc``) and are tried in file order.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from rustext.fields import check_fields

__all__ = ["KINDS", "ProxyConfig", "proxies_from_toml"]

#: what a proxy may be asked
KINDS = ("connect", "refresh", "subscribe", "publish", "rpc")
#: kinds picked by a channel or URI glob
MATCHED = ("subscribe", "publish", "rpc")


@dataclass(frozen=True, kw_only=True, slots=True)
class ProxyConfig:
    """One ``[[proxy]]`` table: an endpoint of the application answering one kind of question."""

    #: what it answers: connect, refresh, subscribe, publish or rpc
    kind: str
    #: ``http://…`` / ``https://…`` (a JSON POST to that URL) or ``grpc://HOST:PORT`` (the JugglerProxy service)
    endpoint: str
    #: its name in metrics and logs (default: the endpoint)
    name: str = ""
    #: seconds the backend has to answer (a CALL's own timeout bounds an rpc proxy further)
    timeout: float = 1.0
    #: channel globs (subscribe, publish) or URI globs (rpc) this proxy decides; not for connect/refresh
    match: tuple[str, ...] = ()
    #: handshake headers passed on to the backend (an allow-list, case-insensitive)
    headers: tuple[str, ...] = ()
    #: handshake cookies passed on to the backend (an allow-list)
    cookies: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("match", "headers", "cookies"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        scheme = urlsplit(self.endpoint).scheme
        if scheme not in ("http", "https", "grpc"):
            raise ValueError(f"endpoint must be an http://, https:// or grpc:// URL, got {self.endpoint!r}")
        if not urlsplit(self.endpoint).hostname:
            raise ValueError(f"endpoint {self.endpoint!r} names no host")
        if scheme == "grpc" and urlsplit(self.endpoint).port is None:
            raise ValueError(f"grpc endpoint {self.endpoint!r} needs a port")
        if not (math.isfinite(self.timeout) and self.timeout > 0):
            raise ValueError("timeout must be a number of seconds > 0")
        if self.kind in MATCHED and not self.match:
            raise ValueError(f'kind = "{self.kind}" needs match (the globs it decides)')
        if self.kind not in MATCHED and self.match:
            raise ValueError(f'kind = "{self.kind}" takes no match')
        if (self.headers or self.cookies) and self.kind != "connect":
            raise ValueError("headers and cookies are handshake data: only a connect proxy takes them")
        if not self.name:
            object.__setattr__(self, "name", self.endpoint)

    @property
    def grpc(self) -> bool:
        """Spoken over gRPC (else HTTP)."""
        return self.endpoint.startswith("grpc://")


def proxies_from_toml(data: Any) -> tuple[ProxyConfig, ...]:
    """``[[proxy]]`` tables (a list of dicts) → configs; ValueError naming the bad one."""
    if not isinstance(data, list):
        raise ValueError("proxy must be an array of tables ([[proxy]])")
    names = {f.name for f in dataclasses.fields(ProxyConfig)}
    out: list[ProxyConfig] = []
    for i, table in enumerate(data, 1):
        where = f"[[proxy]] #{i}"
        if not isinstance(table, dict):
            raise ValueError(f"{where} must be a table")
        unknown = sorted(set(table) - names)
        if unknown:
            raise ValueError(f"unknown option(s) in {where}: {', '.join(unknown)}")
        for required in ("kind", "endpoint"):
            if required not in table:
                raise ValueError(f"{where}: {required} is required")
        table = check_fields(ProxyConfig, table, where)
        try:
            cfg = ProxyConfig(**table)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where}: {exc}") from exc
        if cfg.kind in ("connect", "refresh") and any(p.kind == cfg.kind for p in out):
            raise ValueError(f"{where}: a second {cfg.kind} proxy (one at most)")
        out.append(cfg)
    return tuple(out)
