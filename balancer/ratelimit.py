"""Typed configuration of the request rate limit (the ``[rate_limit]`` table).

The data plane counts requests (GCRA, nginx's ``limit_req`` with ``burst``,
and ``nodelay`` or ``delay``) in one table shared by every worker; see
``rustext/src/balancer/ratelimit.rs`` and the "Rate limiting" section of
``docs/balancer.md``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from balancer.errors import BalancerConfigError

_RATE = re.compile(r"^\s*(\d+)\s*r?\s*/\s*(s|sec|second|m|min|minute|h|hour)\s*$")
_PERIODS = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0,
            "h": 3600.0, "hour": 3600.0}
_HEADER = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")


def parse_rate(value: Any, where: str = "rate_limit.rate") -> tuple[int, float]:
    """``"100/s"`` (also ``/m``, ``/h``, nginx's ``10r/s``) → (count, period in seconds)."""
    m = _RATE.match(value) if isinstance(value, str) else None
    if not m or int(m.group(1)) == 0:
        raise BalancerConfigError(
            f"{where} must be requests per period such as \"100/s\", \"600/m\" or \"10r/s\", got {value!r}")
    count, period = int(m.group(1)), _PERIODS[m.group(2)]
    if count > period * 1_000_000_000:  # the data plane spaces requests by whole nanoseconds
        raise BalancerConfigError(f"{where} is over one request per nanosecond, got {value!r}")
    return count, period


@dataclass(frozen=True, kw_only=True)
class RateLimit:
    """Requests per client address (or per header value) over every listener;
    more get ``status`` (429) with ``Retry-After``."""

    #: requests per period: ``"100/s"``, ``"600/m"``, ``"10r/s"`` (a steady rate: one request per
    #: 1/rate, plus ``burst``)
    rate: str
    #: requests accepted at once above the steady rate (nginx's ``burst`` with ``nodelay``): a quiet
    #: key takes ``burst + 1`` requests at once
    burst: int = 0
    #: what requests are counted under: ``"src"`` (the client address) or ``"header:NAME"``
    key: str = "src"
    #: with a header key, requests without the header: ``"src"`` counts them by client address,
    #: ``"allow"`` lets them through unlimited
    missing: str = "src"
    #: keys remembered at most (about 60 bytes each); when full, the least recently seen key is
    #: forgotten (as nginx's zone size, HAProxy's ``size``)
    max_keys: int = 100_000
    #: status of a refused request
    status: int = 429
    #: ``true``: requests within ``burst`` pass at once (nginx's ``nodelay``); ``false``: they wait
    #: until they conform to the rate (nginx's ``limit_req`` without ``nodelay``), see ``delay``
    nodelay: bool = True
    #: with ``nodelay = false``: this many early requests pass at once, later ones wait (nginx's
    #: ``delay=N``; 0: every early request waits)
    delay: int = 0

    def __post_init__(self) -> None:
        parse_rate(self.rate)
        if isinstance(self.burst, bool) or not isinstance(self.burst, int) or not 0 <= self.burst <= 1_000_000:
            raise BalancerConfigError(f"rate_limit.burst must be an integer in 0..1000000, got {self.burst!r}")
        if not isinstance(self.key, str) or not (
                self.key == "src" or (self.key.startswith("header:") and _HEADER.match(self.key[7:].strip()))):
            raise BalancerConfigError(f"rate_limit.key must be \"src\" or \"header:NAME\", got {self.key!r}")
        if self.missing not in ("src", "allow"):
            raise BalancerConfigError(f"rate_limit.missing must be \"src\" or \"allow\", got {self.missing!r}")
        if isinstance(self.max_keys, bool) or not isinstance(self.max_keys, int) or not (
                1 <= self.max_keys <= 100_000_000):
            raise BalancerConfigError(
                f"rate_limit.max_keys must be an integer in 1..100000000, got {self.max_keys!r}")
        if isinstance(self.status, bool) or not isinstance(self.status, int) or not 400 <= self.status <= 599:
            raise BalancerConfigError(f"rate_limit.status must be a 4xx or 5xx status, got {self.status!r}")
        if not isinstance(self.nodelay, bool):
            raise BalancerConfigError(f"rate_limit.nodelay must be true or false, got {self.nodelay!r}")
        if isinstance(self.delay, bool) or not isinstance(self.delay, int) or not 0 <= self.delay <= 1_000_000:
            raise BalancerConfigError(f"rate_limit.delay must be an integer in 0..1000000, got {self.delay!r}")
        if self.delay and self.nodelay:
            raise BalancerConfigError("rate_limit.delay applies with nodelay = false (with nodelay every "
                                      "request within the burst passes at once)")

    @property
    def per_period(self) -> tuple[int, float]:
        """``rate`` as (requests, period in seconds)."""
        return parse_rate(self.rate)
