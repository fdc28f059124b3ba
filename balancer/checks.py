"""Checks of configuration values shared by the configuration's sections
(listeners, routes, pools, access logs, health checks): addresses, Unix
socket paths, the PROXY header and HTTP/2 options. Each raises
:class:`balancer.errors.BalancerConfigError` naming the key. Kept apart so
that every section can use them without importing the others."""

from __future__ import annotations

import re
from typing import Any

from balancer.errors import BalancerConfigError

__all__ = [
    "ONE_YEAR", "PROTOS", "U32_MAX", "U64_MAX", "check_count", "check_h2_limits", "check_proto", "check_seconds",
    "check_send_proxy", "check_unix_path", "is_token", "parse_hostport", "unix_path",
]

#: the largest counts the data plane holds (its 32- and 64-bit fields)
U32_MAX = 2**32 - 1
U64_MAX = 2**64 - 1
#: the longest duration the data plane takes, in seconds
ONE_YEAR = 365 * 86_400
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")


def is_token(value: object) -> bool:
    """Whether ``value`` is an HTTP token (a header or cookie name)."""
    return isinstance(value, str) and _TOKEN.match(value) is not None


def check_count(value: Any, where: str, top: int = U64_MAX) -> None:
    """An integer in 0..top, the range of the data plane's field; errors name ``where``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
        raise BalancerConfigError(f"{where} must be an integer in 0..{top}, got {value!r}")


def check_seconds(value: Any, where: str) -> None:
    """A duration the data plane takes: a finite number of seconds, 0 to one year,
    and not a positive one shorter than the nanosecond the data plane counts in
    (it would be 0 there, whose meaning is often "none")."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= ONE_YEAR:
        raise BalancerConfigError(
            f"{where} must be a number of seconds between 0 and one year ({ONE_YEAR}), got {value!r}")
    if 0 < value < 1e-9:
        raise BalancerConfigError(f"{where} must be 0 or at least a nanosecond (1e-9 seconds), got {value!r}")


def unix_path(value: object) -> str | None:
    """The socket path of a Unix address (``unix:/path``, HAProxy's ``unix@/path``), else None."""
    if isinstance(value, str):
        for prefix in ("unix:", "unix@"):
            if value.startswith(prefix):
                return value[len(prefix):]
    return None


def check_unix_path(path: str, what: str) -> None:
    if not path.startswith("/"):
        raise BalancerConfigError(f"{what} must be an absolute path after 'unix:', got {path!r}")
    if len(path.encode()) > 107:
        raise BalancerConfigError(f"{what} {path!r} is longer than a unix socket path may be (107 bytes)")


def parse_hostport(value: str, what: str) -> tuple[str, int]:
    """Split ``host:port`` (``[v6]:port`` allowed); raises BalancerConfigError."""
    from rustext.net import parse_hostport as parse

    try:
        return parse(value, what=what)
    except ValueError as exc:
        raise BalancerConfigError(str(exc)) from None


def check_send_proxy(value: object, what: str) -> None:
    """``send_proxy`` is unset, ``"v1"``, ``"v2"`` or ``"none"``."""
    if value is not None and value not in ("v1", "v2", "none"):
        raise BalancerConfigError(f"{what} must be \"v1\", \"v2\" or \"none\", got {value!r}")


#: what ``proto`` takes
PROTOS = ("h1", "h2")


def check_h2_limits(streams: Any, connections: Any, where: str) -> None:
    """Refuse HTTP/2 connection limits out of range, naming the key (``where``: a pool's prefix)."""
    for key, value, top in (("h2_max_streams", streams, 1000), ("h2_connections", connections, 64)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top):
            raise BalancerConfigError(f"{where}{key} must be an integer in 1..{top}, got {value!r}")


def check_proto(value: Any, where: str) -> None:
    """Refuse a ``proto`` other than h1 or h2, naming the key."""
    if value not in PROTOS:
        raise BalancerConfigError(f"{where} must be \"h1\" or \"h2\", got {value!r}")
