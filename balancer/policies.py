"""Typed configuration of the pool policies: cookie persistence (``sticky``),
backup servers, slow start, ``retry_on`` and layer-7 passive health.

The data plane applies them (``rustext/src/balancer/upstream/policy.rs``);
this module checks the values and derives a pool's :class:`Policy` from its
settings, which the data plane reads (:func:`pool_policy`). The TOML shapes
are in the "Sticky sessions", "Backup servers and slow start" and "Failures"
sections of ``docs/balancer.md``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from balancer.checks import U64_MAX
from balancer.errors import BalancerConfigError

_COOKIE_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_COOKIE_VALUE = re.compile(r"^[A-Za-z0-9\-._~]{1,128}$")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
#: ``retry_on`` words besides statuses (``conn-failure``, ``empty-response`` and ``junk-response``
#: describe what is always done)
RETRY_WORDS = ("conn-failure", "empty-response", "junk-response", "response-timeout", "all-retryable-errors")
#: HAProxy's ``all-retryable-errors``, as far as it applies here
ALL_RETRYABLE = ("conn-failure", "empty-response", "junk-response", "response-timeout", "500", "502", "503", "504")
#: statuses counted as errors with ``observe = "layer7"`` (HAProxy's: every 5xx but 501 and 505)
LAYER7_ERRORS = tuple(s for s in range(500, 600) if s not in (501, 505))


def parse_duration(value: Any, where: str) -> float:
    """Seconds from a number or ``"30s"``, ``"500ms"``, ``"2m"``, ``"1h"``."""
    if isinstance(value, bool):
        raise BalancerConfigError(f"{where} must be a duration such as \"30s\" or a number of seconds")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        m = _DURATION.match(value) if isinstance(value, str) else None
        if not m:
            raise BalancerConfigError(f"{where} must be a duration such as \"30s\" or a number of seconds, "
                                      f"got {value!r}")
        seconds = float(m.group(1)) * {"ms": 0.001, "s": 1.0, None: 1.0, "m": 60.0, "h": 3600.0}[m.group(2)]
    if not 0 <= seconds <= 86_400:
        raise BalancerConfigError(f"{where} must be between 0 and one day, got {value!r}")
    return seconds


def parse_retry_on(value: Any, where: str = "retry_on") -> tuple[str, ...]:
    """A list of statuses (``"503"`` or ``503``) and words (:data:`RETRY_WORDS`), as strings."""
    if not isinstance(value, (list, tuple)):
        raise BalancerConfigError(f"{where} must be a list such as [\"503\", \"response-timeout\"]")
    out: list[str] = []
    for v in value:
        s = str(v) if isinstance(v, int) and not isinstance(v, bool) else v
        if not isinstance(s, str) or not (s in RETRY_WORDS or (s.isdigit() and 400 <= int(s) <= 599)):
            raise BalancerConfigError(
                f"{where}: {v!r} is neither a 4xx/5xx status nor one of {', '.join(RETRY_WORDS)}")
        out.extend(ALL_RETRYABLE if s == "all-retryable-errors" else (s,))
    return tuple(dict.fromkeys(out))


@dataclass(frozen=True, kw_only=True)
class Sticky:
    """Cookie persistence (HAProxy's ``cookie NAME insert indirect nocache``):
    a client is sent back to the server that served it first."""

    #: the cookie's name
    cookie: str = "SERVERID"
    #: ``"insert"``: the balancer sets the cookie (the only mode)
    mode: str = "insert"
    #: remove the cookie from requests before they reach the server
    indirect: bool = True
    #: responses that set the cookie get ``Cache-Control: private`` (a shared cache must not keep them)
    nocache: bool = True
    #: the cookie's ``HttpOnly`` attribute
    httponly: bool = True
    #: the cookie's ``Secure`` attribute
    secure: bool = False
    #: the cookie's ``Max-Age`` in seconds; unset: a session cookie
    max_age: int | None = None
    #: the cookie's ``Domain``; unset: the request's host
    domain: str | None = None
    #: the cookie's ``Path``
    path: str = "/"

    def __post_init__(self) -> None:
        if not isinstance(self.cookie, str) or not _COOKIE_NAME.match(self.cookie):
            raise BalancerConfigError(f"sticky.cookie must be a cookie name, got {self.cookie!r}")
        if self.mode != "insert":
            raise BalancerConfigError(f"sticky.mode must be \"insert\", got {self.mode!r}")
        if self.max_age is not None and (isinstance(self.max_age, bool) or not isinstance(self.max_age, int)
                                         or not 0 <= self.max_age <= U64_MAX):
            raise BalancerConfigError(f"sticky.max_age must be a number of seconds >= 0, got {self.max_age!r}")
        for name in ("domain", "path"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, str) or not v or any(c in v for c in ";,\r\n \t")):
                raise BalancerConfigError(f"sticky.{name} must be a {name} without ';', ',' or spaces, got {v!r}")


def check_cookie_value(value: Any, server: str) -> None:
    if not isinstance(value, str) or not _COOKIE_VALUE.match(value):
        raise BalancerConfigError(
            f"backend {server} cookie must be 1 to 128 letters, digits or -._~, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class Policy:
    """A pool's policies as the data plane applies them, derived from the
    pool's settings and its servers' (see :func:`pool_policy`)."""

    #: the backup servers, by address
    backups: tuple[str, ...] = ()
    #: balance over every available backup, not only the first
    all_backups: bool = False
    #: (server address, seconds) of every server with a slow start
    slow_start: tuple[tuple[str, float], ...] = ()
    #: statuses after which a replayable request goes to another server
    retry_statuses: tuple[int, ...] = ()
    #: a replayable request whose response is late goes to another server
    retry_timeout: bool = False
    #: statuses counted as failures by passive health (``observe = "layer7"``; empty: layer 4)
    error_statuses: tuple[int, ...] = ()
    #: cookie persistence, if any
    sticky: Sticky | None = None
    #: (server address, cookie value) of the servers given a ``cookie`` of their own
    cookies: tuple[tuple[str, str], ...] = ()


def pool_policy(cfg: Any) -> Policy:
    """The :class:`Policy` of one pool (a :class:`balancer.config.BalancerConfig`
    whose ``backends`` are the pool's servers)."""
    pool_slow = parse_duration(cfg.slow_start, "slow_start")
    slow = []
    for b in cfg.backends:
        s = pool_slow if b.slow_start is None else parse_duration(b.slow_start, f"backend {b.address} slow_start")
        if s > 0:
            slow.append((b.address, s))
    retry = parse_retry_on(cfg.retry_on)
    passive = cfg.passive
    return Policy(
        backups=tuple(b.address for b in cfg.backends if b.backup),
        all_backups=cfg.all_backups,
        slow_start=tuple(slow),
        retry_statuses=tuple(int(s) for s in retry if s.isdigit()),
        retry_timeout="response-timeout" in retry,
        error_statuses=tuple(passive.error_statuses) if passive.observe == "layer7" else (),
        sticky=cfg.sticky,
        cookies=tuple((b.address, b.cookie) for b in cfg.backends if b.cookie is not None) if cfg.sticky is not None else (),
    )
